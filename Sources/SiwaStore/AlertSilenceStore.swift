import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A silence: no sink hears about alerts of `kind` (for `aud`, or every app) until `until`.
package struct AlertSilence: Sendable {
    package var id: Int
    package var kind: AlertKind
    package var aud: String?
    package var until: Date
    package var createdAt: Date
    package var createdBy: String
    package var reason: String?
}

/// The `alert_silences` table: silences made (`alerts silence`), listed, and the one covering an
/// alert when it fires or grows (`AlertStore` asks, in its own transaction).
package struct AlertSilenceStore: Sendable {
    let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: SilencesCreate

    package func silence(kind: AlertKind, aud: String?, for duration: Duration, by actor: String, reason: String?) async throws -> AlertSilence {
        var silence: AlertSilence?
        for try await row in try await client.bounded.query(
            """
            INSERT INTO alert_silences (kind, aud, until, created_by, reason)
            VALUES (\(kind.rawValue), \(aud), now() + \(Int(duration.milliseconds)) * interval '1 millisecond', \(actor), \(reason))
            RETURNING id, until, created_at
            """, logger: logger
        ).decode((Int, Date, Date).self) {
            silence = AlertSilence(id: row.0, kind: kind, aud: aud, until: row.1, createdAt: row.2, createdBy: actor, reason: reason)
        }
        guard let silence else { throw StoreError.noRow("alert_silences insert") }
        return silence
    }

    // MARK: SilencesList

    /// Silences still running (and, with `expired`, the last day's ended ones too), newest first.
    package func silences(includeExpired: Bool) async throws -> [AlertSilence] {
        var result: [AlertSilence] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, kind, aud, until, created_at, created_by, reason FROM alert_silences
            WHERE until > now() - CASE WHEN \(includeExpired) THEN interval '1 day' ELSE interval '0' END
            ORDER BY created_at DESC, id DESC LIMIT 1000
            """, logger: logger
        ).decode((Int, String, String?, Date, Date, String, String?).self) {
            result.append(
                AlertSilence(id: row.0, kind: AlertKind(rawValue: row.1) ?? .test, aud: row.2, until: row.3, createdAt: row.4, createdBy: row.5, reason: row.6))
        }
        return result
    }

    // MARK: SilencesCovering

    /// The silence covering alerts of `key`'s kind and app now (the one running longest), if any;
    /// inside the caller's transaction.
    static func covering(_ key: AlertKey, on connection: PostgresConnection, logger: Logger) async throws -> Int? {
        var id: Int?
        for try await (silence,) in try await connection.query(
            """
            SELECT id FROM alert_silences
            WHERE kind = \(key.kind.rawValue) AND (aud IS NULL OR aud = \(key.aud)) AND until > now()
            ORDER BY until DESC LIMIT 1
            """, logger: logger
        ).decode((Int,).self) {
            id = silence
        }
        return id
    }
}

extension AlertSilence {
    package var json: JSONValue {
        [
            "id": .number(Double(id)), "kind": .string(kind.rawValue), "aud": aud.map(JSONValue.string) ?? .null,
            "until": .string(iso8601(until)), "created_at": .string(iso8601(createdAt)), "created_by": .string(createdBy),
            "reason": reason.map(JSONValue.string) ?? .null,
        ]
    }
}
