import Foundation
import Logging
import PostgresNIO

/// A notification's job in one lane as it stands now (its attempts are in the attempt log).
package struct NotificationJob: Sendable {
    package var id: Int
    package var lane: Lane
    package var state: JobState
    package var attempt: Int
    package var maxAttempts: Int
    package var createdAt: Date
    package var runAt: Date
    package var finishedAt: Date?
    package var lastStatus: Int?
    package var lastError: String?
    /// Callbacks: the Standard Webhooks `webhook-id` the backend sees (`msg_<n>`); nil otherwise.
    package var webhookID: String?
}

extension JobQueue {
    // MARK: JobsOfNotification

    /// The jobs of notification `notificationID` (one per lane at most), effects first.
    package func jobs(notificationID: Int) async throws -> [NotificationJob] {
        var result: [NotificationJob] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, lane, state::text, attempt, max_attempts, created_at, run_at, finished_at, last_status, last_error
            FROM jobs WHERE notification_id = \(notificationID) ORDER BY id
            """, logger: logger
        ).decode((Int, String, String, Int, Int, Date, Date, Date?, Int?, String?).self) {
            guard let lane = Lane(rawValue: row.1), let state = JobState(rawValue: row.2) else { continue }
            result.append(
                NotificationJob(
                    id: row.0, lane: lane, state: state, attempt: row.3, maxAttempts: row.4, createdAt: row.5, runAt: row.6, finishedAt: row.7,
                    lastStatus: row.8, lastError: row.9, webhookID: lane == .callbacks ? Self.webhookID(notificationID: notificationID) : nil))
        }
        return result
    }
}

extension JobQueue {
    // MARK: JobsRekey

    /// Moves the jobs of a user's notifications from sub `old` to `new`, in the caller's
    /// transaction (an app transfer's re-key; call it before the notifications move).
    static func rekeyNotificationJobs(aud: String, from old: String, to new: String, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            UPDATE jobs SET sub = \(new)
            WHERE id IN (SELECT j.id FROM notifications n JOIN jobs j ON j.notification_id = n.id WHERE n.aud = \(aud) AND n.sub = \(old))
              AND aud = \(aud) AND sub = \(old)
            """, logger: logger)
    }
}
