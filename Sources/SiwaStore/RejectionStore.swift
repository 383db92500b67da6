import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A refused delivery, as recorded for diagnosis.
package struct RejectionRecord: Sendable {
    package var receivedAt: Date
    package var remoteAddress: String?
    package var reason: RejectionReason
    package var message: String
    package var bodySize: Int
    package var bodyPrefix: [UInt8]
    package var kid: String?
    package var aud: String?
    package var jti: String?
    /// The user, when the body held a readable event (so erasure can find the row).
    package var sub: String?
    /// The whole token and the key that verified it, only when the signature was valid.
    package var token: String?
    package var keyJWK: String?

    package init(
        receivedAt: Date, remoteAddress: String?, reason: RejectionReason, message: String, bodySize: Int, bodyPrefix: [UInt8],
        kid: String? = nil, aud: String? = nil, jti: String? = nil, sub: String? = nil, token: String? = nil, keyJWK: String? = nil
    ) {
        // Text from a refused body is attacker-controlled: bounded (so no value is too large to
        // store or index), and without NUL (which PostgreSQL refuses in text).
        func clean(_ text: String?, limit: Int = UntrustedText.maximumBytes) -> String? {
            UntrustedText.bounded(text.map { $0.replacingOccurrences(of: "\u{0}", with: "") }, limit: limit)
        }
        self.receivedAt = receivedAt
        self.remoteAddress = clean(remoteAddress)
        self.reason = reason
        self.message = clean(message, limit: 4 * UntrustedText.maximumBytes) ?? ""
        self.bodySize = bodySize
        self.bodyPrefix = bodyPrefix
        self.kid = clean(kid)
        self.aud = clean(aud)
        self.jti = clean(jti)
        self.sub = clean(sub)
        // Kept only when Apple's signature verified it (the body limit bounds its size).
        self.token = token.map { $0.replacingOccurrences(of: "\u{0}", with: "") }
        self.keyJWK = keyJWK
    }
}

/// How many rejections of one reason in one minute were recorded and how many only counted.
package struct RejectionCount: Sendable, Hashable {
    package var minute: Date
    package var reason: RejectionReason
    package var recorded: Int
    package var sampledOut: Int

    package init(minute: Date, reason: RejectionReason, recorded: Int, sampledOut: Int) {
        self.minute = minute
        self.reason = reason
        self.recorded = recorded
        self.sampledOut = sampledOut
    }
}

package struct StoredRejection: Sendable, Codable {
    package var id: Int
    package var receivedAt: Date
    package var remoteAddress: String?
    package var reason: String
    package var message: String
    package var bodySize: Int
    package var kid: String?
    package var aud: String?
    package var jti: String?
    package var hasToken: Bool
    package var replayedAt: Date?
    package var replayOutcome: String?
    /// received_at in µs since 1970 (exact, for keyset cursors).
    package var sortMicros: Int64 = 0
}

package struct ReplayCandidate: Sendable {
    package var id: Int
    package var receivedAt: Date
    package var remoteAddress: String?
    package var token: String
    package var keyJWK: String
}

package struct RejectionStore: Sendable {
    let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: RejectionsErase, RejectionsPrune

    /// Deletes the kept tokens (their keys, and the body prefix, which holds the same address) of
    /// rejections naming one of `subs`: erasure of a user's address.
    static func eraseKeptTokens(subs: [String], on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            UPDATE rejections SET token = NULL, key_jwk = NULL, body_prefix = ''::bytea
            WHERE sub = ANY(\(subs)::text[]) AND (token IS NOT NULL OR length(body_prefix) > 0)
            """, logger: logger)
    }

    /// Deletes up to `limit` rejections received before `retention` ago, oldest first; callers
    /// repeat while it returns a full batch.
    @discardableResult
    package func prune(retention: Duration, limit: Int = 1000) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH pruned AS (
                DELETE FROM rejections WHERE id IN (
                    SELECT id FROM rejections WHERE received_at < now() - \(Int(retention.components.seconds)) * interval '1 second'
                    ORDER BY received_at LIMIT \(limit))
                RETURNING id
            )
            SELECT count(*)::bigint FROM pruned
            """, logger: logger)
    }

    // MARK: RejectionsInsertBatch

    /// Writes a batch of sampled rejections in one transaction.
    package func insert(_ records: [RejectionRecord]) async throws {
        guard !records.isEmpty else { return }
        try await client.bounded.transaction(logger: logger) { connection in
            for record in records {
                try await insert(record, on: connection)
            }
        }
    }

    /// Adds per-minute counts, in a transaction of their own: no refused row can take them down.
    package func add(_ counts: [RejectionCount]) async throws {
        guard !counts.isEmpty else { return }
        try await client.bounded.transaction(logger: logger) { connection in
            for c in counts {
                try await connection.query(
                    """
                    INSERT INTO rejection_counts (minute, reason, recorded, sampled_out)
                    VALUES (\(c.minute), \(c.reason.rawValue), \(c.recorded), \(c.sampledOut))
                    ON CONFLICT (minute, reason) DO UPDATE SET
                        recorded = rejection_counts.recorded + excluded.recorded,
                        sampled_out = rejection_counts.sampled_out + excluded.sampled_out
                    """, logger: logger)
            }
        }
    }

    /// Inserts rows one transaction each, dropping (and logging once) each row PostgreSQL refuses
    /// for what it holds (`canHeal` false): the fallback when a batch fails, so one bad row cannot
    /// block every later one. Returns the rows not attempted because the database failed in a way
    /// that can heal (to keep for later), and how many were dropped.
    package func insertIndividually(_ records: [RejectionRecord]) async -> (remaining: [RejectionRecord], dropped: Int) {
        var dropped = 0
        for (index, record) in records.enumerated() {
            do {
                try await client.bounded.withConnection { try await insert(record, on: $0) }
            } catch where !canHeal(error) {
                dropped += 1
                logger.warning("rejection record refused by the database; dropped", metadata: ["reason": "\(record.reason.rawValue)", "error": "\(loggable(error))"])
            } catch {
                return (Array(records[index...]), dropped)
            }
        }
        return ([], dropped)
    }

    private func insert(_ r: RejectionRecord, on connection: PostgresConnection) async throws {
        try await connection.query(
            """
            INSERT INTO rejections (received_at, remote_addr, reason, message, body_size, body_prefix, kid, aud, jti, sub, token, key_jwk)
            VALUES (\(r.receivedAt), \(r.remoteAddress), \(r.reason.rawValue), \(r.message), \(r.bodySize),
                    \(ByteBuffer(bytes: r.bodyPrefix)), \(r.kid), \(r.aud), \(r.jti), \(r.sub), \(r.token), \(r.keyJWK)::jsonb)
            ON CONFLICT DO NOTHING
            """, logger: logger)
    }

    // MARK: RejectionsList

    /// Newest first; `after` is the (received_at µs, id) of the last row of the previous page.
    package func list(reason: String?, limit: Int, after: (micros: Int64, id: Int)? = nil) async throws -> [StoredRejection] {
        var sql = SQLBuilder(
            """
            SELECT id, received_at, remote_addr, reason, message, body_size, kid, aud, jti, token IS NOT NULL, replayed_at, replay_outcome,
                (extract(epoch FROM received_at) * 1000000)::bigint
            FROM rejections
            """)
        sql.filter("reason =", reason)
        if let after {
            sql.condition("(received_at, id) < (timestamptz 'epoch' + ")
            sql.bind(after.micros)
            sql.append(" * interval '1 microsecond', ")
            sql.bind(after.id)
            sql.append(")")
        }
        sql.append(" ORDER BY received_at DESC, id DESC LIMIT ")
        sql.bind(max(1, min(limit, 10_000)))
        var result: [StoredRejection] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(
            (Int, Date, String?, String, String, Int, String?, String?, String?, Bool, Date?, String?, Int64).self)
        {
            result.append(
                StoredRejection(
                    id: row.0, receivedAt: row.1, remoteAddress: row.2, reason: row.3, message: row.4, bodySize: row.5, kid: row.6,
                    aud: row.7, jti: row.8, hasToken: row.9, replayedAt: row.10, replayOutcome: row.11, sortMicros: row.12))
        }
        return result
    }

    /// Totals per reason since `since`, including what sampling left out.
    package func counts(since: Date) async throws -> [(reason: String, recorded: Int, sampledOut: Int)] {
        var result: [(String, Int, Int)] = []
        for try await row in try await client.bounded.query(
            """
            SELECT reason, sum(recorded)::bigint, sum(sampled_out)::bigint FROM rejection_counts
            WHERE minute >= \(since) GROUP BY reason ORDER BY reason
            """, logger: logger
        ).decode((String, Int, Int).self) {
            result.append(row)
        }
        return result
    }

    /// Deliveries rejected since the minute of `since` (recorded or sampled out), by reason; the
    /// alert rules read it (`bad_signatures`, and `quiet_app` naming why an app is quiet).
    package func rejected(since: Date) async throws -> [String: Int] {
        var result: [String: Int] = [:]
        for try await (reason, count) in try await client.bounded.query(
            """
            SELECT reason, sum(recorded + sampled_out)::bigint FROM rejection_counts
            WHERE minute >= date_trunc('minute', \(since)) GROUP BY reason HAVING sum(recorded + sampled_out) > 0
            """, logger: logger
        ).decode((String, Int).self) {
            result[reason] = count
        }
        return result
    }

    // MARK: RejectionsReplay

    /// Rejections that kept their token and have not been replayed successfully yet.
    package func replayCandidates(reason: String) async throws -> [ReplayCandidate] {
        var result: [ReplayCandidate] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, received_at, remote_addr, token, key_jwk::text FROM rejections
            WHERE reason = \(reason) AND token IS NOT NULL AND replayed_at IS NULL ORDER BY id
            """, logger: logger
        ).decode((Int, Date, String?, String, String).self) {
            result.append(ReplayCandidate(id: row.0, receivedAt: row.1, remoteAddress: row.2, token: row.3, keyJWK: row.4))
        }
        return result
    }

    package func markReplayed(id: Int, outcome: String, succeeded: Bool, at: Date) async throws {
        let replayedAt: Date? = succeeded ? at : nil
        try await client.bounded.query(
            "UPDATE rejections SET replayed_at = \(replayedAt), replay_outcome = \(outcome) WHERE id = \(id)", logger: logger)
    }
}
