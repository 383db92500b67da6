import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The suppression feed's reads: pages of changes after a cursor (the change's id, taken in
/// commit order: see `SuppressionStore`), and the addresses suppressed now.
extension SuppressionStore {
    /// Changes after `after` (0: from the start), oldest first, at most `limit`; of `aud` only, or
    /// of any of `apps`.
    package func changes(apps: [String], after: Int, limit: Int) async throws -> [SuppressionFeedItem] {
        try await feedItems(
            """
            SELECT id, aud, address, sub, action, reason, event_time, recorded_at FROM suppression_changes
            WHERE id > \(after) AND aud = ANY(\(apps)::text[])
            ORDER BY id LIMIT \(max(1, min(limit, 10_000)))
            """)
    }

    /// The addresses of `apps` suppressed now, by (aud, address), after the key `after`, at most `limit`.
    package func suppressed(apps: [String], after: SuppressionKey? = nil, limit: Int) async throws -> [SuppressionEntry] {
        try await entries(apps: apps, after: after, limit: limit, suppressedOnly: true)
    }

    /// Every address known for `apps` (suppressed or not), by key after `after`: what a backfill pushes.
    package func known(apps: [String], after: SuppressionKey?, limit: Int) async throws -> [SuppressionEntry] {
        try await entries(apps: apps, after: after, limit: limit, suppressedOnly: false)
    }

    private func entries(apps: [String], after: SuppressionKey?, limit: Int, suppressedOnly: Bool) async throws -> [SuppressionEntry] {
        var entries: [SuppressionEntry] = []
        for try await row in try await client.bounded.query(
            """
            SELECT aud, address, sub, suppressed, reason, event_time FROM suppressions
            WHERE aud = ANY(\(apps)::text[]) AND (aud, address) > (\(after?.aud ?? ""), \(after?.address ?? "")) AND (suppressed OR NOT \(suppressedOnly))
            ORDER BY aud, address LIMIT \(max(1, min(limit, 10_000)))
            """, logger: logger
        ).decode((String, String, String, Bool, String, Date).self) {
            entries.append(
                SuppressionEntry(aud: row.0, address: row.1, sub: row.2, suppressed: row.3, reason: SuppressionReason(rawValue: row.4) ?? .emailDisabled, eventTime: row.5))
        }
        return entries
    }

    /// Feed lines of `query` (its columns: id, aud, address, sub, action, reason, event_time, recorded_at).
    func feedItems(_ query: PostgresQuery) async throws -> [SuppressionFeedItem] {
        var items: [SuppressionFeedItem] = []
        for try await row in try await client.bounded.query(query, logger: logger).decode((Int, String, String, String, String, String, Date, Date).self) {
            guard let action = SuppressionAction(rawValue: row.4), let reason = SuppressionReason(rawValue: row.5) else { continue }
            items.append(
                SuppressionFeedItem(cursor: row.0, aud: row.1, address: row.2, sub: row.3, action: action, reason: reason, eventTime: row.6, recordedAt: row.7))
        }
        return items
    }
}

extension SuppressionStore {
    /// How many addresses of `apps` are known (what a backfill will push).
    package func knownCount(apps: [String]) async throws -> Int {
        try await client.bounded.count("SELECT count(*)::bigint FROM suppressions WHERE aud = ANY(\(apps)::text[])", logger: logger)
    }
}

extension SuppressionStore {
    /// The user's changes in the feed, oldest first, and each provider's operations for them.
    package func timeline(aud: String, sub: String, limit: Int) async throws -> (changes: [SuppressionFeedItem], operations: [SuppressionOperation]) {
        let changes = try await feedItems(
            """
            SELECT id, aud, address, sub, action, reason, event_time, recorded_at FROM suppression_changes
            WHERE aud = \(aud) AND sub = \(sub) ORDER BY id LIMIT \(max(1, min(limit, 10_000)))
            """)
        let operations = try await JobQueue(client: client, logger: logger).suppressionOperations(aud: aud, sub: sub, limit: limit)
        return (changes, operations)
    }
}
