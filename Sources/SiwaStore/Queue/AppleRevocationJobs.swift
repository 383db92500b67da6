import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The `apple_revocations` lane: its statements. Jobs are enqueued in the transaction that takes
/// the tokens from `apple_tokens` (`AppleTokenStore.enqueueRevocations`, through
/// `enqueueAppleRevocationsSQL`); an operator lists them, puts them back, and re-seals their
/// payloads under a new key.
extension JobQueue {
    /// The body of a data-modifying CTE that queues one revocation per row of `taken` (columns
    /// `aud`, `sub`, `client_id`, `token`: the ciphertext becomes the payload), returning `id`.
    static func enqueueAppleRevocationsSQL(from taken: String) -> String {
        """
        INSERT INTO jobs (lane, kind, aud, sub, target, payload, run_at)
        SELECT '\(Lane.appleRevocations.rawValue)', '\(AppleTokenKind.refreshToken.rawValue)', aud, sub, client_id, token, now()
        FROM \(taken)
        RETURNING id
        """
    }

    /// How many pending revocations' payloads each key id encrypts.
    func appleRevocationPayloadsByKey() async throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for try await (key, n) in try await client.bounded.query(
            """
            SELECT split_part(payload, '.', 2), count(*)::bigint FROM jobs
            WHERE lane = \(Lane.appleRevocations.rawValue) AND payload IS NOT NULL GROUP BY 1
            """, logger: logger
        ).decode((String, Int).self) {
            counts[key] = n
        }
        return counts
    }

    /// Up to `limit` pending revocations whose payload is under a key other than `currentKeyID`.
    func appleRevocationPayloads(notUnder currentKeyID: String, limit: Int) async throws -> [(id: Int, owner: AppleTokenOwner, ciphertext: String)] {
        var found: [(id: Int, owner: AppleTokenOwner, ciphertext: String)] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, aud, sub, payload FROM jobs
            WHERE lane = \(Lane.appleRevocations.rawValue) AND payload IS NOT NULL AND split_part(payload, '.', 2) <> \(currentKeyID)
            LIMIT \(limit)
            """, logger: logger
        ).decode((Int, String, String, String).self) {
            found.append((row.0, AppleTokenOwner(aud: row.1, sub: row.2), row.3))
        }
        return found
    }

    /// Replaces a pending revocation's payload if it is still `stored` (a completed revocation in
    /// between wins). Returns whether it was replaced.
    func replaceAppleRevocationPayload(id: Int, _ stored: String, with replacement: String) async throws -> Bool {
        var replaced = false
        for try await (n,) in try await client.bounded.query(
            """
            WITH r AS (UPDATE jobs SET payload = \(replacement)
                       WHERE id = \(id) AND lane = \(Lane.appleRevocations.rawValue) AND payload = \(stored)
                       RETURNING 1)
            SELECT count(*)::bigint FROM r
            """, logger: logger
        ).decode((Int,).self) {
            replaced = n > 0
        }
        return replaced
    }

    /// A revocation job as `apple revocations` lists it (never its payload).
    package struct AppleRevocationSummary: Sendable {
        package var id: Int
        package var state: JobState
        package var attempt: Int
        package var aud: String
        package var sub: String
        package var clientID: String
        package var tokenType: String
        package var createdAt: Date
        package var runAt: Date
        package var finishedAt: Date?
        package var lastStatus: Int?
        package var lastError: String?
        /// The fingerprint of the token the last recorded call sent.
        package var fingerprint: String?

        /// As the timeline and `apple revocations --json` show it (never the token).
        package var json: JSONValue {
            .object([
                "id": .number(Double(id)), "state": .string(state.rawValue), "attempt": .number(Double(attempt)), "aud": .string(aud),
                "sub": .string(sub), "client_id": .string(clientID), "token_type": .string(tokenType),
                "token_fingerprint": fingerprint.map(JSONValue.string) ?? .null, "created_at": .string(iso8601(createdAt)),
                "run_at": .string(iso8601(runAt)), "finished_at": finishedAt.map { .string(iso8601($0)) } ?? .null,
                "last_status": lastStatus.map { .number(Double($0)) } ?? .null, "last_error": lastError.map(JSONValue.string) ?? .null,
            ])
        }
    }

    /// Revocations Apple has not taken yet: `waiting` (ready, retrying or being sent) and
    /// `discarded` (out of attempts: their tokens stay, unrevoked, until `apple retry`).
    package struct AppleRevocationBacklog: Sendable, Equatable {
        package var waiting = 0
        package var discarded = 0

        package var json: JSONValue { .object(["waiting": .number(Double(waiting)), "discarded": .number(Double(discarded))]) }
    }

    /// The lane's backlog, read through the queue's partial indexes (`depth`).
    package func appleRevocationBacklog() async throws -> AppleRevocationBacklog {
        var backlog = AppleRevocationBacklog()
        for depth in try await depth() where depth.lane == .appleRevocations {
            if depth.state == .discarded { backlog.discarded += depth.count } else if depth.state.isOpen { backlog.waiting += depth.count }
        }
        return backlog
    }

    /// Newest first; `failed`: only those retrying or discarded; `aud`/`sub`: one user's.
    package func listAppleRevocations(failed: Bool, aud: String? = nil, sub: String? = nil, limit: Int) async throws -> [AppleRevocationSummary] {
        var result: [AppleRevocationSummary] = []
        for try await row in try await client.bounded.query(
            """
            SELECT j.id, j.state::text, j.attempt, j.aud, j.sub, j.target, j.kind, j.created_at, j.run_at, j.finished_at, j.last_status, j.last_error,
                (SELECT c.token_fingerprint FROM apple_auth_calls c WHERE c.job_id = j.id ORDER BY c.id DESC LIMIT 1)
            FROM jobs j
            WHERE j.lane = \(Lane.appleRevocations.rawValue)
              AND (NOT \(failed) OR j.state IN ('retryable', 'discarded'))
              AND (\(aud)::text IS NULL OR (j.aud = \(aud) AND j.sub = \(sub)))
            ORDER BY j.created_at DESC, j.id DESC
            LIMIT \(max(1, min(limit, 10_000)))
            """, logger: logger
        ).decode((Int, String, Int, String, String, String, String, Date, Date, Date?, Int?, String?, String?).self) {
            guard let state = JobState(rawValue: row.1) else { continue }
            result.append(
                AppleRevocationSummary(
                    id: row.0, state: state, attempt: row.2, aud: row.3, sub: row.4, clientID: row.5, tokenType: row.6, createdAt: row.7, runAt: row.8,
                    finishedAt: row.9, lastStatus: row.10, lastError: row.11, fingerprint: row.12))
        }
        return result
    }

    /// Puts revocations back in the queue with fresh attempts: one by id, or every discarded one
    /// (`retry` of the lane).
    @discardableResult
    package func retryAppleRevocations(id: Int?, discarded: Bool) async throws -> Int {
        try await retry(lane: .appleRevocations, id: id, discarded: discarded)
    }
}
