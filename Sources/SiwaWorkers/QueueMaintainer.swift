import Foundation
import Logging
import ServiceLifecycle
import SiwaRuntime
import SiwaStore
import Synchronization

/// What one maintenance round did.
package struct MaintenanceRound: Sendable, Equatable {
    /// Jobs taken back from deliverers that stopped renewing their lease.
    package var rescued = 0
    /// Finished jobs past `SIWA_JOB_RETENTION` deleted (nil: pruning was not due this round).
    package var pruned: Int?

    package init(rescued: Int = 0, pruned: Int? = nil) {
        self.rescued = rescued
        self.pruned = pruned
    }
}

/// Keeps the queue healthy, every `QueueUpkeep.interval`: rescues leased jobs whose deliverer died
/// (their lease ran out) and, once a minute, prunes finished jobs past their retention.
package final class QueueMaintainer: Service, Sendable {
    /// What the maintainer reads.
    package struct Configuration: Sendable {
        /// A rescued job out of attempts is discarded.
        package var maxAttempts: Int
        /// Finished jobs are deleted after this.
        package var retention: Duration
        package var interval: Duration
    }

    let configuration: Configuration
    let queue: JobQueue
    /// Rung after a rescue (every lane's), so idle loops take the rescued jobs at once.
    let doorbells: [Doorbell]
    let logger: Logger
    private let lastPrune = Mutex<ContinuousClock.Instant?>(nil)
    static let pruneInterval: Duration = .seconds(60)

    init(configuration: Configuration, queue: JobQueue, doorbells: [Doorbell], logger: Logger) {
        self.configuration = configuration
        self.queue = queue
        self.doorbells = doorbells
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: configuration.interval, retryAfter: configuration.interval, phase: Phase.queue), once: { try await self.runOnce() }) { error in
            logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// One round at `now`: the rescue, and the prune when a minute has passed since the last one
    /// (the first round always prunes). `queueNow`: the time leases and retention are judged at
    /// (nil: PostgreSQL's, which every process shares; tests pass theirs).
    @discardableResult
    package func runOnce(now: ContinuousClock.Instant = .now, queueNow: Date? = nil) async throws -> MaintenanceRound {
        var round = MaintenanceRound()
        round.rescued = try await queue.rescueExpiredLeases(maxAttempts: configuration.maxAttempts, now: queueNow)
        if round.rescued > 0 {
            logger.warning("rescued jobs whose worker stopped renewing its lease", metadata: ["count": "\(round.rescued)"])
            for doorbell in doorbells { doorbell.ring() }
        }
        let due = lastPrune.withLock { last in
            guard last.map({ now - $0 >= Self.pruneInterval }) ?? true else { return false }
            last = now
            return true
        }
        if due {
            let pruned = try await queue.prune(retention: configuration.retention, now: queueNow)
            if pruned > 0 { logger.info("pruned finished jobs", metadata: ["count": "\(pruned)"]) }
            round.pruned = pruned
        }
        return round
    }
}
