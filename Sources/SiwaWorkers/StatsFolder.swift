import Logging
import ServiceLifecycle
import SiwaRuntime
import SiwaStore

/// Folds the deltas the ingest triggers append into the stats counts, every few seconds (bounded
/// per round: at most ten batches of `HistoryStore.foldLimit`).
package final class StatsFolder: Service, Sendable {
    let history: HistoryStore
    let interval: Duration
    let logger: Logger

    init(history: HistoryStore, interval: Duration, logger: Logger) {
        self.history = history
        self.interval = interval
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: interval, retryAfter: interval), once: { try await self.runOnce() }) { error in
            logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
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
