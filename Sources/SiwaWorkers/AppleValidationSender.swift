import AsyncHTTPClient
import Foundation
import Logging
import SiwaApple
import SiwaDomain
import SiwaStore

/// Validates one kept refresh token at Apple's `/auth/token` (`grant_type=refresh_token`): the
/// job names the user and client ID, its payload the fingerprint of the token that was due.
/// A token deleted or replaced since has nothing left to validate. `invalid_grant` means the user
/// revoked the app where no notification reached us: their sessions are revoked as on
/// `consent-revoked`. Anything else Apple answers (or no answer) is retried by the queue. The
/// gateway records every call (the user's timeline shows it).
struct AppleValidationSender: DeliverySender {
    let store: AppleTokenStore
    let cipher: AppleTokenCipher
    let gateway: AppleGateway
    let logger: Logger

    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        guard let aud = delivery.aud, let sub = delivery.sub, let clientID = delivery.target else {
            return .undeliverable(error: "the job names no user or client ID")
        }
        let owner = AppleTokenOwner(aud: aud, sub: sub)
        do {
            guard let token = try await store.kept(owner, clientID: clientID), token.fingerprint == delivery.body else {
                return .delivered(status: nil)  // deleted or replaced since it was due: a new one is due a day after it was kept
            }
            guard let clear = try? cipher.decrypt(token.ciphertext, owner: owner) else {
                return .undeliverable(error: "the kept token cannot be decrypted: check SIWA_APPLE_TOKEN_KEYS (`apple reencrypt` reports the tokens no key opens)")
            }
            let call = try await gateway.refresh(refreshToken: clear, clientID: clientID, about: AppleCallSubject(aud: aud, sub: sub, jobID: delivery.id))
            let refusal: AppleAuthError? = if case .failure(.apple(let error)) = call.result { error } else { nil }
            switch AppleTokenValidation.verdict(succeeded: (try? call.result.get()) != nil, refusal: refusal) {
            case .valid:
                try await store.markValid(token, at: delivery.claimedAt)
            case .consentLost:
                let revoked = try await store.consentLost(token, at: delivery.claimedAt)
                logger.notice(
                    "Apple refused a kept refresh token (invalid_grant): the user revoked the app; treated as consent-revoked",
                    metadata: ["aud": "\(aud)", "client_id": "\(clientID)", "revoked_sessions": "\(revoked)"])
            case .retry:
                let why = if case .failure(let failure) = call.result { failure.description } else { "no answer" }
                return .failed(status: call.record.status, error: why)
            }
            return .delivered(status: call.record.status)
        } catch {
            return .failed(status: nil, error: loggable(error))
        }
    }

    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata {
        ["client_id": "\(delivery.target ?? "")", "aud": "\(delivery.aud ?? "")"]
    }
}

extension DeliveryLane {
    /// Lane `apple_validations`: kept refresh tokens to Apple's `/auth/token`, a few at once (the
    /// scheduler's rounds set the pace).
    package static func appleValidations(
        _ revocations: AppleRevocations, store: AppleTokenStore, gateway: AppleGateway, retry: RetryPolicy, logger: Logger
    ) -> DeliveryLane {
        DeliveryLane(
            lane: .appleValidations, sender: AppleValidationSender(store: store, cipher: revocations.cipher, gateway: gateway, logger: logger),
            event: "Apple token validation", retry: retry, concurrency: 4, timeout: revocations.client.configuration.timeout)
    }
}
