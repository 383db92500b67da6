import Foundation
import Logging
import PostgresNIO

/// One attempt at a job, as the attempt log (`job_attempts`) keeps it after the job is pruned.
package struct AttemptRecord: Sendable {
    package var lane: Lane
    package var attempt: Int
    package var worker: String
    package var startedAt: Date
    package var finishedAt: Date
    package var outcome: AttemptOutcome
    package var error: String?
    package var effect: String?
    package var revokedSessions: Int?
    package var httpStatus: Int?
}

/// The effect a notification's last applied attempt recorded.
package struct AppliedAttempt: Sendable {
    package var effect: String?
    package var revokedSessions: Int?
    package var finishedAt: Date
}

/// The reads of the attempt log that history needs.
extension JobQueue {
    /// Every attempt at the jobs of notification `notificationID` (all lanes), oldest first.
    package func attempts(notificationID: Int) async throws -> [AttemptRecord] {
        var result: [AttemptRecord] = []
        for try await row in try await client.bounded.query(
            """
            SELECT lane, attempt, worker, started_at, finished_at, outcome, error, effect->>'effect', (effect->>'revoked_sessions')::int, http_status
            FROM job_attempts WHERE notification_id = \(notificationID) ORDER BY id
            """, logger: logger
        ).decode((String, Int, String, Date, Date, String, String?, String?, Int?, Int?).self) {
            guard let lane = Lane(rawValue: row.0), let outcome = AttemptOutcome(rawValue: row.5) else { continue }
            result.append(
                AttemptRecord(
                    lane: lane, attempt: row.1, worker: row.2, startedAt: row.3, finishedAt: row.4, outcome: outcome, error: row.6, effect: row.7,
                    revokedSessions: row.8, httpStatus: row.9))
        }
        return result
    }

    /// For each of `notificationIDs` whose effect was applied, the last applied attempt's effect.
    package func appliedEffects(notificationIDs: [Int]) async throws -> [Int: AppliedAttempt] {
        guard !notificationIDs.isEmpty else { return [:] }
        var result: [Int: AppliedAttempt] = [:]
        for try await row in try await client.bounded.query(
            """
            SELECT n.id, a.effect->>'effect', (a.effect->>'revoked_sessions')::int, a.finished_at
            FROM unnest(\(notificationIDs)::bigint[]) AS n(id)
            JOIN LATERAL (
                SELECT effect, finished_at FROM job_attempts
                WHERE notification_id = n.id AND lane = 'effects' AND outcome = 'applied' ORDER BY id DESC LIMIT 1
            ) a ON true
            """, logger: logger
        ).decode((Int, String?, Int?, Date).self) {
            result[row.0] = AppliedAttempt(effect: row.1, revokedSessions: row.2, finishedAt: row.3)
        }
        return result
    }
}
