import Logging
import ServiceLifecycle
import SiwaRuntime
import SiwaStore

/// What one history prune did.
package struct HistoryPruneRound: Sendable, Equatable {
    /// Notifications past `SIWA_HISTORY_RETENTION` deleted.
    package var notifications = 0
    /// Rejections past `SIWA_HISTORY_RETENTION` deleted.
    package var rejections = 0
    /// Rejections whose kept token (another app's) was deleted past its retention.
    package var keptTokens = 0
    /// Records of calls to Apple's auth endpoints past `SIWA_HISTORY_RETENTION` deleted.
    package var appleCalls = 0

    package init(notifications: Int = 0, rejections: Int = 0, keptTokens: Int = 0, appleCalls: Int = 0) {
        self.notifications = notifications
        self.rejections = rejections
        self.keptTokens = keptTokens
        self.appleCalls = appleCalls
    }
}

/// Deletes history past its retention, once a minute: notifications, rejections and the records
/// of calls to Apple past `SIWA_HISTORY_RETENTION` (a thousand at a time, at most 50,000 of each
/// a round), and the whole tokens kept for other apps past theirs.
package final class HistoryPruner: Service, Sendable {
    package struct Configuration: Sendable {
        /// Notifications and rejections older than this are deleted.
        package var retention: Duration = .seconds(400 * 86_400)
        /// Whole tokens kept for another app's bundle ID are deleted after this.
        package var otherAppTokenRetention: Duration = .seconds(7 * 86_400)
        /// How soon a round that failed is tried again.
        package var retryAfter: Duration = .seconds(5)

        package init() {}
    }

    let configuration: Configuration
    let notifications: NotificationStore
    let rejections: RejectionStore
    let history: HistoryStore
    let appleCalls: AppleTokenStore
    let logger: Logger
    static let interval: Duration = .seconds(60)
    static let batch = 1000

    init(configuration: Configuration, notifications: NotificationStore, rejections: RejectionStore, history: HistoryStore, logger: Logger) {
        self.configuration = configuration
        self.notifications = notifications
        self.rejections = rejections
        self.history = history
        self.appleCalls = AppleTokenStore(client: history.client, logger: logger)
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: Self.interval, retryAfter: configuration.retryAfter, phase: Phase.history), once: { try await self.runOnce() }) { error in
            logger.warning("history pruning failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    @discardableResult
    package func runOnce() async throws -> HistoryPruneRound {
        var round = HistoryPruneRound()
        round.notifications = try await Self.repeating { try await self.notifications.prune(retention: self.configuration.retention, limit: Self.batch) }
        round.rejections = try await Self.repeating { try await self.rejections.prune(retention: self.configuration.retention, limit: Self.batch) }
        round.appleCalls = try await Self.repeating { try await self.appleCalls.pruneCalls(retention: self.configuration.retention, limit: Self.batch) }
        if round.notifications + round.rejections + round.appleCalls > 0 {
            logger.info(
                "pruned history past its retention",
                metadata: ["notifications": "\(round.notifications)", "rejections": "\(round.rejections)", "apple_calls": "\(round.appleCalls)"])
        }
        round.keptTokens = try await history.deleteKeptTokens(olderThan: configuration.otherAppTokenRetention)
        if round.keptTokens > 0 {
            logger.info("deleted tokens kept for other apps past their retention", metadata: ["count": "\(round.keptTokens)"])
        }
        return round
    }

    /// Runs `prune` while it deletes a full batch, at most 50 times.
    private static func repeating(_ prune: () async throws -> Int) async throws -> Int {
        var total = 0
        for _ in 0..<50 {
            let deleted = try await prune()
            total += deleted
            if deleted < batch || Task.isCancelled { break }
        }
        return total
    }
}
