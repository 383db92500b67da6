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

/// Keeps the queue healthy, every `maintenanceInterval`: rescues leased jobs whose deliverer died
/// (their lease ran out) and, once a minute, prunes finished jobs past their retention.
package final class QueueMaintainer: Service, Sendable {
    let configuration: EffectWorkers.Configuration
    let store: EffectStore
    /// Rung after a rescue, so an idle worker takes the rescued jobs at once.
    let doorbell: Doorbell
    let logger: Logger
    private let lastPrune = Mutex<ContinuousClock.Instant?>(nil)
    static let pruneInterval: Duration = .seconds(60)

    init(configuration: EffectWorkers.Configuration, store: EffectStore, doorbell: Doorbell, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.doorbell = doorbell
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: configuration.maintenanceInterval, retryAfter: configuration.maintenanceInterval), once: { try await self.runOnce() }) { error in
            logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// One round at `now`: the rescue, and the prune when a minute has passed since the last one
    /// (the first round always prunes). `queueNow`: the time leases and retention are judged at
    /// (nil: PostgreSQL's, which every process shares; tests pass theirs).
    @discardableResult
    package func runOnce(now: ContinuousClock.Instant = .now, queueNow: Date? = nil) async throws -> MaintenanceRound {
        var round = MaintenanceRound()
        round.rescued = try await store.rescueExpiredLeases(maxAttempts: configuration.maxAttempts, now: queueNow)
        if round.rescued > 0 {
            logger.warning("rescued jobs whose worker stopped renewing its lease", metadata: ["count": "\(round.rescued)"])
            doorbell.ring()
        }
        let due = lastPrune.withLock { last in
            guard last.map({ now - $0 >= Self.pruneInterval }) ?? true else { return false }
            last = now
            return true
        }
        if due {
            let pruned = try await store.prune(retention: configuration.retention, now: queueNow)
            if pruned > 0 { logger.info("pruned finished jobs", metadata: ["count": "\(pruned)"]) }
            round.pruned = pruned
        }
        return round
    }
}
