import AsyncHTTPClient
import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Synchronization
import Testing

/// A lane declared by this test target alone (no edit under Sources/, no migration): its jobs go
/// through enqueue, claim, retry, discard, list and retry-discarded on a real database, sent by a
/// sender of its own.
@Suite("A lane declared outside Sources/ runs like the built-in ones", .timeLimit(.minutes(10)))
struct DeclaredLaneTests {
    /// Pings about a notification: the test's own lane.
    static let pings = Lane("test_pings", subject: .notification)

    /// Answers each attempt with the next outcome, then `delivered`; keeps what it was sent.
    final class ScriptedSender: DeliverySender {
        private let script = Mutex<(outcomes: [DeliveryOutcome], sent: [String])>(([], []))

        init(_ outcomes: [DeliveryOutcome]) { script.withLock { $0.outcomes = outcomes } }

        var sent: [String] { script.withLock { $0.sent } }

        func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
            script.withLock { script in
                script.sent.append(delivery.body)
                return script.outcomes.isEmpty ? .delivered(status: 200) : script.outcomes.removeFirst()
            }
        }

        func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata { ["ping": "\(delivery.id)"] }
    }

    @Test("enqueued, claimed, retried, discarded, listed, retried from discarded and delivered; its attempts are on record")
    func lifecycle() async throws {
        let h = try await EffectHarness.start()
        let logger = h.h.logs.logger()
        let queue = JobQueue(client: h.client, logger: logger)
        try await h.post("email-enabled", sub: "ping-1", at: 1_000, email: "p1@privaterelay.appleid.com", jti: "ping-jti-1")
        var notificationID = 0
        for try await (id,) in try await h.client.query("SELECT id FROM notifications WHERE jti = 'ping-jti-1'").decode((Int,).self) { notificationID = id }

        let ids = try await queue.enqueue([NewJob(lane: Self.pings, subject: .notification(id: notificationID), kind: "ping", payload: #"{"ping":1}"#)])
        #expect(ids.count == 1)
        // Enqueued again for the same notification: one job per notification and kind.
        #expect(try await queue.enqueue([NewJob(lane: Self.pings, subject: .notification(id: notificationID), kind: "ping", payload: "{}")]).isEmpty)

        let sender = ScriptedSender([.failed(status: 503, error: "HTTP 503"), .failed(status: nil, error: "connection refused")])
        let lane = DeliveryLane(
            lane: Self.pings, sender: sender, event: "ping", retry: RetryPolicy(maxAttempts: 2, backoff: RetryBackoff(base: .zero, cap: .zero)),
            concurrency: 1, timeout: .seconds(5))
        let deliverer = Deliverer(lane: lane, worker: "pinger", configuration: .init(lease: .seconds(30), pollInterval: .seconds(60)), queue: queue, logger: logger)

        #expect(try await deliverer.runOnce(http: .shared).retrying == 1)
        #expect(try await deliverer.runOnce(http: .shared).discarded == 1)
        #expect(try await deliverer.runOnce(http: .shared).claimed == 0)
        let discarded = try await queue.list(lane: Self.pings, state: .discarded, limit: 10)
        #expect(discarded.map(\.id) == ids && discarded.first?.lastError == "connection refused" && discarded.first?.notificationID == notificationID)
        #expect(discarded.first?.json["payload"] == nil)
        #expect(try await queue.discardedByLane(since: Date().addingTimeInterval(-60))["test_pings"] == 1)

        #expect(try await queue.retry(lane: Self.pings, id: nil, discarded: true) == 1)
        #expect(try await deliverer.runOnce(http: .shared).delivered == 1)
        #expect(sender.sent == Array(repeating: #"{"ping":1}"#, count: 3))
        #expect(try await queue.list(lane: Self.pings, limit: 10).map(\.state) == [.completed])
        #expect(try await h.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'test_pings'") == 3)
        // Nothing else took it: the built-in lanes' jobs are their own.
        #expect(try await queue.list(lane: .callbacks, limit: 10).isEmpty)
        await h.stop()
    }
}
