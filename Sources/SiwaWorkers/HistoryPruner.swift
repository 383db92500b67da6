import Logging
import ServiceLifecycle
import SiwaRuntime
import SiwaStore

/// What one history prune did.
package struct HistoryPruneRound: Sendable, Equatable {
    /// Notifications past `SIWA_HISTORY_RETENTION` deleted (rejections past it go with them).
    package var notifications = 0
    /// Rejections whose kept token (another app's) was deleted past its retention.
    package var keptTokens = 0

    package init(notifications: Int = 0, keptTokens: Int = 0) {
        self.notifications = notifications
        self.keptTokens = keptTokens
    }
}

/// Deletes history past its retention, once a minute: notifications and rejections past
/// `SIWA_HISTORY_RETENTION` (a thousand at a time, at most 50,000 a round), and the whole tokens
/// kept for other apps past theirs.
package final class HistoryPruner: Service, Sendable {
    let configuration: EffectWorkers.Configuration
    let history: HistoryStore
    let logger: Logger
    static let interval: Duration = .seconds(60)

    init(configuration: EffectWorkers.Configuration, history: HistoryStore, logger: Logger) {
        self.configuration = configuration
        self.history = history
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: Self.interval, retryAfter: configuration.maintenanceInterval), once: { try await self.runOnce() }) { error in
            logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    @discardableResult
    package func runOnce() async throws -> HistoryPruneRound {
        var round = HistoryPruneRound()
        for _ in 0..<50 {
            let batch = try await history.prune(retention: configuration.historyRetention)
            round.notifications += batch
            if batch < 1000 || Task.isCancelled { break }
        }
        if round.notifications > 0 { logger.info("pruned notifications past their retention", metadata: ["count": "\(round.notifications)"]) }
        round.keptTokens = try await history.deleteKeptTokens(olderThan: configuration.otherAppTokenRetention)
        if round.keptTokens > 0 {
            logger.info("deleted tokens kept for other apps past their retention", metadata: ["count": "\(round.keptTokens)"])
        }
        return round
    }
}
