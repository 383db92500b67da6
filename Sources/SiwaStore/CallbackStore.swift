import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The callbacks lane as the deliverers and the `callbacks` commands use it; its statements are
/// the queue's (`JobQueue`, DeliveryLanes.swift).
package struct CallbackStore: Sendable {
    package let client: PostgresClient
    let logger: Logger
    private let queue: JobQueue

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
        self.queue = JobQueue(client: client, logger: logger)
    }

    package typealias Summary = JobQueue.CallbackSummary

    package static func webhookID(notificationID: Int) -> String { JobQueue.webhookID(notificationID: notificationID) }
    package static func notificationID(webhookID: String) -> Int? { JobQueue.notificationID(webhookID: webhookID) }

    /// Claims up to `limit` ready deliveries of `lane`, oldest first, leased for `lease`.
    package func claim(lane: DeliveryLane, worker: String, limit: Int, lease: Duration, now: Date? = nil) async throws -> [ClaimedDelivery] {
        try await queue.claimDeliveries(lane: lane, worker: worker, limit: limit, lease: lease, now: now)
    }

    /// Records one attempt; returns the state the job is in now (nil: no longer held).
    @discardableResult
    package func record(
        _ callback: ClaimedDelivery, worker: String, outcome: DeliveryOutcome, maxAttempts: Int, delay: Duration
    ) async throws -> JobState? {
        try await queue.recordDelivery(callback, worker: worker, outcome: outcome, maxAttempts: maxAttempts, delay: delay)
    }

    /// Sends callbacks again: one by job id or by notification (`msg_<n>`), or every one created
    /// since `since`. Returns how many.
    @discardableResult
    package func redeliver(id: Int?, notificationID: Int? = nil, since: Date?) async throws -> Int {
        try await queue.redeliverCallbacks(id: id, notificationID: notificationID, since: since)
    }

    /// Newest first; `failed`: only retrying or discarded ones.
    package func list(failed: Bool, limit: Int) async throws -> [Summary] {
        try await queue.listCallbacks(failed: failed, limit: limit)
    }
}
