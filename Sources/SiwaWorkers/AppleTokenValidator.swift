import Foundation
import Logging
import ServiceLifecycle
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// What one validation round did.
package struct ValidationRound: Sendable, Equatable {
    /// Tokens Apple accepted.
    package var valid = 0
    /// Tokens Apple answered `invalid_grant`: their users treated as `consent-revoked`.
    package var consentLost = 0
    /// Calls that settled nothing (tried again in an hour).
    package var retry = 0

    package var claimed: Int { valid + consentLost + retry }

    package init(valid: Int = 0, consentLost: Int = 0, retry: Int = 0) {
        self.valid = valid
        self.consentLost = consentLost
        self.retry = retry
    }
}

/// Optional (`SIWA_APPLE_VALIDATE_TOKENS`): validates each kept refresh token at Apple at most once
/// a day, at most `perMinute` calls a minute. `invalid_grant` means the user revoked us where we
/// saw no notification: their sessions are revoked as on `consent-revoked`. Every call is recorded
/// by the gateway (the timeline's `apple_calls`); a refused or unanswered one is tried again.
package final class AppleTokenValidator: Service, Sendable {
    package struct Configuration: Sendable {
        /// Calls to Apple a minute at most.
        package var perMinute = 60
        /// How often a round runs; each claims its share of `perMinute`.
        package var interval: Duration = .seconds(10)

        package init() {}

        /// Tokens one round claims.
        var perRound: Int { max(1, Int((Double(perMinute) * interval.timeInterval / 60).rounded(.down))) }
    }

    let configuration: Configuration
    let store: AppleTokenStore
    let cipher: AppleTokenCipher
    let gateway: AppleGateway
    let logger: Logger

    package init(configuration: Configuration, store: AppleTokenStore, cipher: AppleTokenCipher, gateway: AppleGateway, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.cipher = cipher
        self.gateway = gateway
        self.logger = logger
    }

    package func run() async throws {
        await Scheduler.run(.periodic(every: configuration.interval, retryAfter: configuration.interval), once: { try await self.runOnce() }) { error in
            logger.warning("Apple token validation failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// Validates the tokens due at `now`, up to one round's share.
    @discardableResult
    package func runOnce(now: Date = Date()) async throws -> ValidationRound {
        var round = ValidationRound()
        let due = try await store.claimDue(
            dueBefore: AppleTokenValidation.dueBefore(now), mark: AppleTokenValidation.claimedMark(now), limit: configuration.perRound)
        for token in due {
            guard !Task.isCancelled else { break }
            guard let clear = try? cipher.decrypt(token.ciphertext, owner: token.owner) else {
                // serve checks the keyring at start; a token that still does not open is left for `apple reencrypt` to report.
                round.retry += 1
                continue
            }
            let call = try await gateway.refresh(
                refreshToken: clear, clientID: token.clientID, about: AppleCallSubject(aud: token.owner.aud, sub: token.owner.sub))
            let refusal: AppleAuthError? = if case .failure(.apple(let error)) = call.result { error } else { nil }
            switch AppleTokenValidation.verdict(succeeded: (try? call.result.get()) != nil, refusal: refusal) {
            case .valid:
                try await store.markValid(token, at: now)
                round.valid += 1
            case .consentLost:
                let revoked = try await store.consentLost(token, at: now)
                logger.notice(
                    "Apple refused a kept refresh token (invalid_grant): the user revoked the app; treated as consent-revoked",
                    metadata: ["aud": "\(token.owner.aud)", "client_id": "\(token.clientID)", "revoked_sessions": "\(revoked)"])
                round.consentLost += 1
            case .retry:
                round.retry += 1
            }
        }
        return round
    }
}
