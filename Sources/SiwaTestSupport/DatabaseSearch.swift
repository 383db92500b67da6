import Foundation
import PostgresNIO
import SiwaDomain
import Testing

/// Where a value is stored: for tests that check erasure and what is kept.
package enum DatabaseSearch {
    /// Counts rows anywhere in the public schema whose text, jsonb or bytea columns contain
    /// `needle` — as text, or inside base64url (how a JWS carries it).
    /// `except`: tables not searched (the suppression list keeps an erased address on purpose).
    package static func occurrences(of needle: String, in client: PostgresClient, except: Set<String> = []) async throws -> Int {
        var columns: [(String, String, String)] = []
        for try await row in try await client.query(
            """
            SELECT table_name::text, column_name::text, data_type::text FROM information_schema.columns
            WHERE table_schema = 'public' AND data_type IN ('text', 'jsonb', 'bytea', 'character varying')
            """
        ).decode((String, String, String).self) {
            columns.append(row)
        }
        #expect(columns.count > 10)
        // The address inside base64url, at each of the three alignments.
        let encoded = (0..<3).map { shift -> String in
            let padded = Data(repeating: 0x20, count: shift) + Data(needle.utf8)
            return String(Base64URL.encode(padded).dropFirst(shift == 0 ? 0 : shift + 1).dropLast(2))
        }
        var total = 0
        for (table, column, type) in columns where !except.contains(table) {
            let expression = type == "bytea" ? "encode(\"\(column)\", 'escape')" : "\"\(column)\"::text"
            var conditions = ["\(expression) LIKE '%' || $1 || '%'"]
            for (index, _) in encoded.enumerated() { conditions.append("\(expression) LIKE '%' || $\(index + 2) || '%'") }
            var bindings = PostgresBindings()
            bindings.append(needle)
            for value in encoded { bindings.append(value) }
            let query = PostgresQuery(unsafeSQL: "SELECT count(*) FROM \"\(table)\" WHERE \(conditions.joined(separator: " OR "))", binds: bindings)
            for try await (count,) in try await client.query(query).decode((Int,).self) { total += count }
        }
        return total
    }
}
