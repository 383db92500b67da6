import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaRuntime
import SiwaStore
import Synchronization

/// LISTEN siwa_jobs on one pooled connection: each NOTIFY rings the doorbell of its lane's loops
/// (the payload names the lane; any other payload, as ingest's empty one, means effects).
/// Reconnects after errors (database restart); the loops poll meanwhile, and never rely on it.
package final class JobsListener: Service, Sendable {
    let client: PostgresClient
    /// One per lane (`Lane.all`).
    let doorbells: [Lane: Doorbell]
    let logger: Logger
    /// How long one LISTEN holds its connection before giving it back and taking one again.
    let session: Duration

    init(client: PostgresClient, doorbells: [Lane: Doorbell], session: Duration = .seconds(10), logger: Logger) {
        self.client = client
        self.doorbells = doorbells
        self.session = session
        self.logger = logger
    }

    package func run() async throws {
        var schedule = Schedule(interval: .seconds(1))
        schedule.abandonOnShutdown = true
        await Scheduler.run(schedule, once: { try await self.runOnce() }, pace: { _ in .again }) { error in
            logger.debug("LISTEN siwa_jobs interrupted; reconnecting", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// One LISTEN session of up to `session`; returns how many notifications it received.
    ///
    /// The connection goes back to the pool after each session: after a database outage
    /// postgres-nio's pool serves the requests queued meanwhile as connections come back, and a
    /// LISTEN holding one for good could starve every other query.
    @discardableResult
    package func runOnce() async throws -> Int {
        try await withThrowingTaskGroup(of: Int?.self) { group in
            let received = Counter()
            group.addTask {
                try await self.client.bounded.withConnection { connection in
                    try await connection.listen(on: "siwa_jobs") { notifications in
                        // Catch up on anything enqueued before LISTEN took effect.
                        for doorbell in self.doorbells.values { doorbell.ring() }
                        for try await notification in notifications {
                            received.add()
                            self.doorbells[Lane(rawValue: notification.payload) ?? .effects]?.ring()
                        }
                    }
                }
                return nil
            }
            group.addTask {
                try await Task.sleep(for: self.session)
                return nil
            }
            _ = try await group.next()
            group.cancelAll()
            return received.value
        }
    }
}

private final class Counter: Sendable {
    private let count = Mutex(0)
    func add() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
