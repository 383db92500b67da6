import Logging
import ServiceLifecycle
import SiwaRuntime
import SiwaStore

/// Folds the deltas the ingest triggers append into the stats counts (bounded per round: at most
/// ten batches of `HistoryStore.foldLimit`): `interval` after ingest's NOTIFY rings `activity`,
/// at most one round per `interval`, and every `restInterval` with none (a receiver whose NOTIFY
/// was lost still gets folded). With no listener to ring it, every `interval`.
package final class StatsFolder: Service, Sendable {
    package static let restInterval: Duration = .seconds(60)

    let history: HistoryStore
    let interval: Duration
    let activity: Doorbell?
    let logger: Logger

    init(history: HistoryStore, interval: Duration, activity: Doorbell?, logger: Logger) {
        self.history = history
        self.interval = interval
        self.activity = activity
        self.logger = logger
    }

    package func run() async throws {
        var schedule = Schedule.periodic(every: activity == nil ? interval : Self.restInterval, retryAfter: interval, phase: Phase.stats)
        schedule.doorbell = activity
        if activity != nil { schedule.minimumGap = interval }
        await Scheduler.run(schedule, once: { try await self.runOnce() }) { error in
            logger.warning("folding the stats counts failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// Folds what is there, up to ten batches; returns how many deltas it folded.
    @discardableResult
    package func runOnce() async throws -> Int {
        var folded = 0
        for _ in 0..<10 {
            let batch = try await history.foldCounts()
            folded += batch
            if batch < HistoryStore.foldLimit || Task.isCancelled { break }
        }
        return folded
    }
}
