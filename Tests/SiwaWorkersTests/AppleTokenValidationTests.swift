import AsyncHTTPClient
import Foundation
import PostgresNIO
import SiwaApple
import SiwaAppleStandIn
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The optional daily validation of kept refresh tokens, against the stand-in for Apple over real
/// HTTP: the scheduler driven by `runOnce` with the time passed in, the `apple_validations`
/// lane by its deliverer's `runOnce`.
@Suite("Apple token validation: daily, rate-limited; invalid_grant is treated like consent-revoked", .timeLimit(.minutes(10)))
struct AppleTokenValidationTests {
    static func harness(_ apple: AppleRevocationTests.Apple, perMinute: Int) async throws -> EffectHarness {
        try await EffectHarness.start { configuration in
            configuration.lanes.apple = AppleRevocations(client: apple.client, cipher: AppleRevocationTests.cipher)
            var validation = AppleTokenValidator.Configuration()
            validation.perMinute = perMinute
            validation.interval = .seconds(10)
            configuration.appleValidation = validation
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
        }
    }

    /// Runs the `apple_validations` lane's deliverer once: the jobs the scheduler queued.
    static func validate(_ h: EffectHarness) async throws -> DeliveryRound {
        try await #require(h.workers.deliverer(.appleValidations)).runOnce(http: .shared)
    }

    @Test("a token is validated a day after it was kept, then not again for a day; invalid_grant revokes the user's sessions as consent-revoked and is recorded")
    func invalidGrantRevokesSessions() async throws {
        let apple = try await AppleRevocationTests.Apple.start(signer: AppleRevocationTests.signer)
        let h = try await Self.harness(apple, perMinute: 60)
        let validator = try #require(h.workers.validator)
        let good = try await apple.refreshToken(sub: "val-good")
        let gone = try await apple.refreshToken(sub: "val-gone")
        _ = try await AppleRevocationTests.keep(good, sub: "val-good", in: h)
        _ = try await AppleRevocationTests.keep(gone, sub: "val-gone", in: h)
        let goodSession = try await h.session(sub: "val-good", createdAt: 1_000)
        let goneSession = try await h.session(sub: "val-gone", createdAt: 1_000)
        // The user stops using Apple ID with the app in Settings: Apple ends the grant; no notification reaches us.
        _ = try await apple.client.revoke(token: gone, hint: .refreshToken, clientID: Harness.aud).result.get()

        let start = Date()
        #expect(try await validator.runOnce(now: start) == 0)  // kept just now: not due
        let dayLater = start.addingTimeInterval(AppleTokenValidation.interval + 60)
        #expect(try await validator.runOnce(now: dayLater) == 2)
        #expect(try await validator.runOnce(now: dayLater.addingTimeInterval(2 * AppleTokenValidation.retryAfter)) == 0, "a token with an open job gets no second")
        #expect(try await Self.validate(h).delivered == 2)
        // Validated when its job ran: due again a day after that, not before.
        #expect(try await validator.runOnce(now: Date().addingTimeInterval(AppleTokenValidation.interval - 60)) == 0)
        #expect(try await validator.runOnce(now: Date().addingTimeInterval(AppleTokenValidation.interval + 60)) == 1)

        #expect(try await h.activeSessions(sub: "val-good") == [goodSession])
        #expect(try await h.activeSessions(sub: "val-gone").isEmpty)
        #expect(try await h.h.count(
            "SELECT count(*) FROM sessions WHERE id = '\(goneSession)' AND revoked_reason = 'consent-revoked' AND revoked_by = 'apple-token-validation'") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'val-gone'") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'val-good' AND validated_at IS NOT NULL") == 1)
        let calls = try await AppleTokenStore(client: h.client, logger: h.h.logs.logger()).calls(aud: Harness.aud, sub: "val-gone")
        #expect(calls.map(\.record.error) == [.invalidGrant])
        #expect(calls.first?.record.grantType == .refreshToken)
        #expect(calls.first?.record.tokenFingerprint == AppleAuthRecord.fingerprint(gone))
        #expect(calls.first?.jobID != nil, "the call names the job that made it")
        // As after consent-revoked: a new session needs a new sign-in (a fresh identity token).
        await #expect(throws: AccountStoreError.self) {
            _ = try await AccountStore(client: h.client, logger: h.h.logs.logger()).createSession(aud: Harness.aud, sub: "val-gone", expiresAt: nil, identity: nil)
        }
        #expect(!h.h.logs.all.contains { $0.contains(good) || $0.contains(gone) })
        await h.stop()
        await apple.stop()
    }

    @Test("Apple unavailable: the validation is retried by the queue and settles once Apple answers; a token replaced meanwhile is not validated")
    func retriedByTheQueue() async throws {
        let apple = try await AppleRevocationTests.Apple.start(signer: AppleRevocationTests.signer)
        let h = try await Self.harness(apple, perMinute: 60)
        let validator = try #require(h.workers.validator)
        _ = try await AppleRevocationTests.keep(try await apple.refreshToken(sub: "val-retry"), sub: "val-retry", in: h)
        _ = try await AppleRevocationTests.keep(try await apple.refreshToken(sub: "val-replaced"), sub: "val-replaced", in: h)
        #expect(try await validator.runOnce(now: Date().addingTimeInterval(AppleTokenValidation.interval + 60)) == 2)
        // A new sign-in keeps a new token for one user before the job runs.
        let newer = try await apple.refreshToken(sub: "val-replaced")
        let sealed = AppleRevocationTests.cipher.encrypt(newer, owner: AppleTokenOwner(aud: Harness.aud, sub: "val-replaced"))
        try await h.client.query(
            "UPDATE apple_tokens SET token = \(sealed), fingerprint = \(AppleAuthRecord.fingerprint(newer)) WHERE sub = 'val-replaced'")
        apple.service.failNext(1, of: .token, status: 503)
        let first = try await Self.validate(h)
        #expect(first.delivered == 1 && first.retrying == 1, "\(first)")
        #expect(try await Self.validate(h).delivered == 1)
        let calls = try await AppleTokenStore(client: h.client, logger: h.h.logs.logger()).calls(aud: Harness.aud, sub: "val-retry")
        #expect(calls.map(\.record.status) == [200, 503])  // newest first
        #expect(try await AppleTokenStore(client: h.client, logger: h.h.logs.logger()).calls(aud: Harness.aud, sub: "val-replaced").isEmpty)
        await h.stop()
        await apple.stop()
    }

    @Test("a round enqueues at most its share of SIWA_APPLE_VALIDATIONS_PER_MINUTE; the rest wait for the next round")
    func rateLimited() async throws {
        let apple = try await AppleRevocationTests.Apple.start(signer: AppleRevocationTests.signer)
        let h = try await Self.harness(apple, perMinute: 12)  // 2 per 10-second round
        let validator = try #require(h.workers.validator)
        for index in 0..<5 {
            _ = try await AppleRevocationTests.keep(try await apple.refreshToken(sub: "rate-\(index)"), sub: "rate-\(index)", in: h)
        }
        let dayLater = Date().addingTimeInterval(AppleTokenValidation.interval + 60)
        #expect(try await validator.runOnce(now: dayLater) == 2)
        #expect(try await validator.runOnce(now: dayLater) == 2)
        #expect(try await validator.runOnce(now: dayLater) == 1)
        #expect(try await validator.runOnce(now: dayLater) == 0)
        #expect(try await Self.validate(h).delivered == 4)  // the lane's concurrency
        #expect(try await Self.validate(h).delivered == 1)
        await h.stop()
        await apple.stop()
    }
}
