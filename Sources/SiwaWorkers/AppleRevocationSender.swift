import AsyncHTTPClient
import Foundation
import Logging
import SiwaApple
import SiwaDomain
import SiwaStore

/// What the `apple_revocations` lane and the token validation need: Apple's client (credentials,
/// `/auth/*`), the pacing they share with the process's other calls to Apple (one pause after a
/// 429), and the keyring that decrypts the kept tokens. The workers make their `AppleGateway` of
/// it, recording through the store.
package struct AppleRevocations: Sendable {
    package var client: AppleAuthClient
    package var cipher: AppleTokenCipher
    package var pacer: any ApplePacing = ApplePacer()
    /// Revocations in flight at once per process.
    package var concurrency = AppleRevocations.defaultConcurrency

    package static let defaultConcurrency = 8

    package init(client: AppleAuthClient, cipher: AppleTokenCipher) {
        self.client = client
        self.cipher = cipher
    }
}

/// Revokes one kept token at Apple's `/auth/revoke`: decrypts the job's payload (bound to its
/// aud/sub), sends it with its client ID through the gateway, which records the call
/// (`apple_auth_calls`: client ID, token type, fingerprint, Apple's status and error word) before
/// the attempt counts. Apple answers
/// 200 to any token, so that record is the proof of what was sent. A payload that no key of the
/// keyring opens can never be sent: undeliverable.
struct AppleRevocationSender: DeliverySender {
    let cipher: AppleTokenCipher
    let gateway: AppleGateway

    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        guard let aud = delivery.aud, let sub = delivery.sub, let clientID = delivery.target, let kind = AppleTokenKind(rawValue: delivery.kind) else {
            return .undeliverable(error: "the job names no user, client ID or token type")
        }
        let token: String
        do {
            token = try cipher.decrypt(delivery.body, owner: AppleTokenOwner(aud: aud, sub: sub))
        } catch {
            return .undeliverable(error: "the kept token cannot be decrypted (\(error.description)): check SIWA_APPLE_TOKEN_KEYS")
        }
        let call: AppleGateway.Recorded<Void>
        do {
            call = try await gateway.revoke(token: token, hint: kind, clientID: clientID, about: AppleCallSubject(aud: aud, sub: sub, jobID: delivery.id))
        } catch {
            return .failed(status: nil, error: "the call to Apple could not be recorded: \(loggable(error))")
        }
        switch call.result {
        case .success: return .delivered(status: call.record.status ?? 200)
        case .failure(let failure): return .failed(status: call.record.status, error: failure.description)
        }
    }

    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata {
        ["client_id": "\(delivery.target ?? "")", "aud": "\(delivery.aud ?? "")", "token_type": "\(delivery.kind)"]
    }
}

extension DeliveryLane {
    /// Lane `apple_revocations`: kept tokens to Apple's `/auth/revoke`.
    package static func appleRevocations(_ revocations: AppleRevocations, gateway: AppleGateway, retry: RetryPolicy) -> DeliveryLane {
        DeliveryLane(
            lane: .appleRevocations, sender: AppleRevocationSender(cipher: revocations.cipher, gateway: gateway), event: "Apple token revocation",
            retry: retry, concurrency: revocations.concurrency, timeout: revocations.client.configuration.timeout)
    }
}
