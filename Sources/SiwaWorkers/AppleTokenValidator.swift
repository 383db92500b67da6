import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// Optional (`SIWA_APPLE_VALIDATE_TOKENS`): schedules each kept refresh token's validation at
/// Apple at most once a day, at most `perMinute` a minute: each round claims its share of the
/// tokens due and enqueues a job for each on the `apple_validations` lane, whose sender
/// (`AppleValidationSender`) calls Apple. A token with a job still open gets no second one.
package final class AppleTokenValidator: Service, Sendable {
    package struct Configuration: Sendable {
        /// Validations a minute at most.
        package var perMinute = 60
        /// How often a round runs; each claims its share of `perMinute`.
        package var interval: Duration = .seconds(10)

        package init() {}

        /// Tokens one round claims.
        var perRound: Int { max(1, Int((Double(perMinute) * interval.timeInterval / 60).rounded(.down))) }
    }

    let configuration: Configuration
    let store: AppleTokenStore
    let queue: JobQueue
    let logger: Logger

    package init(configuration: Configuration, store: AppleTokenStore, queue: JobQueue, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.queue = queue
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: configuration.interval, retryAfter: configuration.interval, phase: Phase.apple), once: { try await self.runOnce() }) { error in
            logger.warning("Apple token validation could not be scheduled; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// Enqueues the validation of the tokens due at `now`, up to one round's share; returns how
    /// many jobs were added.
    @discardableResult
    package func runOnce(now: Date = Date()) async throws -> Int {
        let due = try await store.claimDue(
            dueBefore: AppleTokenValidation.dueBefore(now), mark: AppleTokenValidation.claimedMark(now), limit: configuration.perRound)
        let jobs = due.map {
            NewJob(
                lane: .appleValidations, subject: .user(aud: $0.owner.aud, sub: $0.owner.sub, target: $0.clientID),
                kind: AppleTokenKind.refreshToken.rawValue, payload: $0.fingerprint)
        }
        return try await queue.enqueue(jobs).count
    }
}
