import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The `apple_revocations` lane as an operator sees it: its jobs with their last call to Apple,
/// and putting one back. Jobs are enqueued by `AppleTokenStore.enqueueRevocations`.
extension JobQueue {
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

    /// Puts revocations back in the queue with fresh attempts: one by id, or every discarded one.
    /// A completed revocation (its token cleared) or one being sent right now is left alone.
    @discardableResult
    package func retryAppleRevocations(id: Int?, discarded: Bool) async throws -> Int {
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH retried AS (
                UPDATE jobs SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL,
                    last_status = NULL, locked_by = NULL, lease_expires_at = NULL
                WHERE lane = \(Lane.appleRevocations.rawValue) AND state IN ('available', 'retryable', 'discarded')
                  AND ((\(id)::bigint IS NOT NULL AND id = \(id)) OR (\(discarded) AND state = 'discarded'))
                RETURNING id
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        if count > 0 { try await client.bounded.query("SELECT pg_notify('siwa_jobs', \(Lane.appleRevocations.rawValue))", logger: logger) }
        return count
    }
}
