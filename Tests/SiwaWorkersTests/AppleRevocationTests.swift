import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOHTTP1
import PostgresNIO
import SiwaApple
import SiwaAppleStandIn
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The `apple_revocations` lane end to end: a kept refresh token, the account deleted, the token
/// revoked at the stand-in for Apple's `/auth/revoke` over real HTTP, on a real database, the
/// deliverer driven by hand (`runOnce`).
@Suite("Apple revocations: deleting an account revokes its kept tokens at Apple, once, audited", .timeLimit(.minutes(10)))
struct AppleRevocationTests {
    /// A running stand-in with one team (the key of `secrets`) for the harness's bundle ID, and a
    /// client for it signing with that key.
    struct Apple {
        let service: AppleAuthStandIn
        let task: Task<Void, any Error>
        let client: AppleAuthClient

        /// `signingKey`: the key our client signs with (another than the team's: Apple refuses it).
        static func start(signer: AppleStyleSigner, signingKey: P256.Signing.PrivateKey? = nil) async throws -> Apple {
            let secrets = TestClientSecrets()
            let team = StandInTeam(teamID: secrets.teamID, keys: [secrets.keyID: secrets.key.publicKey], clientIDs: [Harness.aud])
            let service = AppleAuthStandIn(
                AppleAuthStandIn.Configuration(teams: [team], signer: signer), logger: Logger(label: "standin", factory: { _ in SwiftLogNoOpLogHandler() }))
            let task = Task { try await service.run() }
            let minter = ClientSecretMinter(
                policy: try ClientSecretPolicy(teamID: secrets.teamID), key: try ClientSecretMinter.SigningKey(keyID: secrets.keyID, privateKey: signingKey ?? secrets.key))
            let client = AppleAuthClient(configuration: .init(baseURL: try await service.url, timeout: .seconds(10)), minter: minter)
            return Apple(service: service, task: task, client: client)
        }

        /// A real refresh token for `sub`: a code issued and exchanged as at sign-in.
        func refreshToken(sub: String) async throws -> String {
            let code = service.issueCode(.init(clientID: Harness.aud, sub: sub, email: nil, isPrivateEmail: nil, nonce: nil, redirectURI: nil))
            let grant = try await client.exchange(code: code, clientID: Harness.aud).result.get()
            return try #require(grant.refreshToken)
        }

        /// Revocation requests the stand-in took for `token` (answered 200 and revoked it).
        func revocations(of token: String) -> Int {
            service.revocations.filter { $0.token == token && $0.status == 200 }.count
        }

        func stop() async {
            task.cancel()
            _ = await task.result
        }
    }

    static let cipher = try! AppleTokenCipher(keys: AppleTokenCipher.generateKey())
    /// Signs the stand-in's id_tokens (nothing here verifies them); made once, RSA keys are slow.
    static let signer = try! AppleStyleSigner.generate()

    static func harness(_ apple: Apple, revokeOnAppleEvents: Bool = false) async throws -> EffectHarness {
        try await EffectHarness.start { configuration in
            configuration.lanes.apple = AppleRevocations(client: apple.client, cipher: cipher)
            configuration.effects.revokeOnAppleEvents = revokeOnAppleEvents
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
        }
    }

    /// Keeps `token` for the user as a sign-in would: the account, and the token encrypted.
    static func keep(_ token: String, sub: String, in e: EffectHarness, cipher: AppleTokenCipher = cipher) async throws -> String {
        let ciphertext = cipher.encrypt(token, owner: AppleTokenOwner(aud: Harness.aud, sub: sub))
        try await e.client.query("INSERT INTO accounts (aud, sub) VALUES (\(Harness.aud), \(sub)) ON CONFLICT DO NOTHING")
        try await e.client.query(
            """
            INSERT INTO apple_tokens (aud, sub, client_id, token, fingerprint)
            VALUES (\(Harness.aud), \(sub), \(Harness.aud), \(ciphertext), \(AppleAuthRecord.fingerprint(token)))
            """)
        return ciphertext
    }

    static func deliver(_ e: EffectHarness) async throws -> Int {
        try await #require(e.workers.deliverer(.appleRevocations)).runOnce(http: .shared).claimed
    }

    @Test("deleting the account moves the token into a revocation job (ciphertext only); a 503 is retried; Apple gets it exactly once; every call audited without the token")
    func deleteRevokesOnce() async throws {
        let apple = try await Apple.start(signer: Self.signer)
        let h = try await Self.harness(apple)
        let token = try await apple.refreshToken(sub: "del-1")
        let ciphertext = try await Self.keep(token, sub: "del-1", in: h)
        _ = try await h.session(sub: "del-1", createdAt: 1_000)

        let erasure = try await AccountStore(client: h.client, logger: h.h.logs.logger()).erase(aud: Harness.aud, sub: "del-1", actor: "test")
        #expect(erasure.appleRevocations == 1)
        #expect(erasure.revokedSessions == 1)
        // The token left apple_tokens with the account, into the job, still encrypted.
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'available' AND payload = '\(ciphertext)'") == 1)
        #expect(try await DatabaseSearch.occurrences(of: token, in: h.client) == 0)

        apple.service.failNext(1, of: .revoke, status: 503)
        #expect(try await Self.deliver(h) == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'retryable' AND last_status = 503") == 1)
        #expect(apple.revocations(of: token) == 0)
        #expect(try await Self.deliver(h) == 1)
        #expect(try await Self.deliver(h) == 0)
        #expect(apple.revocations(of: token) == 1)
        #expect(apple.service.revocations.filter { $0.token == token }.map(\.outcome) == [.injectedFailure(status: 503), .revoked])

        // Done: the job keeps no token; the attempts and Apple's answers are on record.
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'completed' AND payload IS NULL AND last_status = 200") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'apple_revocations'") == 2)
        let calls = try await AppleTokenStore(client: h.client, logger: h.h.logs.logger()).calls(aud: Harness.aud, sub: "del-1")
        #expect(calls.map(\.record.status) == [200, 503])
        for call in calls {
            #expect(call.record.endpoint == .revoke)
            #expect(call.record.clientID == Harness.aud)
            #expect(call.record.tokenTypeHint == .refreshToken)
            #expect(call.record.tokenFingerprint == AppleAuthRecord.fingerprint(token))
            #expect(call.jobID != nil)
        }
        #expect(try await DatabaseSearch.occurrences(of: token, in: h.client) == 0)
        #expect(try await DatabaseSearch.occurrences(of: ciphertext, in: h.client) == 0)
        #expect(!h.h.logs.all.contains { $0.contains(token) })
        // The user's timeline shows the revocation and both calls, by fingerprint.
        let reader = try await API.token(h.h, [.notificationsRead])
        let timeline = try await API.call(h.h, .GET, "/v1/accounts/\(Harness.aud)/del-1/timeline", token: reader)
        #expect(timeline.status == 200)
        #expect(timeline.json?["apple_revocations"]?.arrayValue?.map { $0["state"] } == [.string("completed")], "\(timeline.body)")
        #expect(timeline.json?["apple_calls"]?.arrayValue?.map { $0["status"] } == [.number(200), .number(503)], "\(timeline.body)")
        #expect(!timeline.body.contains(token) && !timeline.body.contains(ciphertext))

        // Apple then sends consent-revoked for the user: applied, nothing more to revoke.
        try await h.post("consent-revoked", sub: "del-1", at: 9_000)
        #expect(try await h.drain() == 1)
        #expect(try await h.h.count("SELECT count(*) FROM notifications WHERE sub = 'del-1' AND status = 'applied'") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations'") == 1)
        #expect(try await Self.deliver(h) == 0)
        #expect(apple.revocations(of: token) == 1)
        await h.stop()
        await apple.stop()
    }

    @Test("a kept token no key of the keyring opens is discarded at its first attempt, naming SIWA_APPLE_TOKEN_KEYS, and never sent")
    func undecryptableIsDiscarded() async throws {
        let apple = try await Apple.start(signer: Self.signer)
        let h = try await Self.harness(apple)
        let other = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let token = try await apple.refreshToken(sub: "lost-1")
        _ = try await Self.keep(token, sub: "lost-1", in: h, cipher: other)
        #expect(try await AccountStore(client: h.client, logger: h.h.logs.logger()).erase(aud: Harness.aud, sub: "lost-1", actor: "test").appleRevocations == 1)
        #expect(try await Self.deliver(h) == 1)
        #expect(try await h.h.count(
            "SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'discarded' AND last_error LIKE '%SIWA_APPLE_TOKEN_KEYS%' AND payload IS NOT NULL") == 1)
        #expect(apple.service.revocations.isEmpty)
        // Kept for an operator: with the key back, `apple retry` would send it.
        #expect(try await JobQueue(client: h.client, logger: h.h.logs.logger()).retryAppleRevocations(id: nil, discarded: true) == 1)
        await h.stop()
        await apple.stop()
    }

    @Test("Apple's account-delete forgets kept tokens by default, and queues them for revocation with SIWA_APPLE_REVOKE_ON_EVENTS", arguments: [false, true])
    func appleEvents(revoke: Bool) async throws {
        let apple = try await Apple.start(signer: Self.signer)
        let h = try await Self.harness(apple, revokeOnAppleEvents: revoke)
        let token = try await apple.refreshToken(sub: "gone-1")
        _ = try await Self.keep(token, sub: "gone-1", in: h)
        let kept = try await apple.refreshToken(sub: "stays-1")
        _ = try await Self.keep(kept, sub: "stays-1", in: h)
        try await h.post("account-delete", sub: "gone-1", at: 5_000)
        #expect(try await h.drain() == 1)
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'gone-1'") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'stays-1'") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND sub = 'gone-1'") == (revoke ? 1 : 0))
        #expect(try await Self.deliver(h) == (revoke ? 1 : 0))
        #expect(apple.revocations(of: token) == (revoke ? 1 : 0))
        #expect(apple.revocations(of: kept) == 0)
        await h.stop()
        await apple.stop()
    }

    @Test("a late consent-revoked spares a token kept after its event time (forgotten or revoked only at or before it); deleting the account still revokes it", arguments: [false, true])
    func lateConsentRevokedSparesNewerToken(revoke: Bool) async throws {
        let apple = try await Apple.start(signer: Self.signer)
        let h = try await Self.harness(apple, revokeOnAppleEvents: revoke)
        // "early-1" kept their token before the event; "late-1" signed in again after it.
        let early = try await apple.refreshToken(sub: "early-1")
        _ = try await Self.keep(early, sub: "early-1", in: h)
        try await h.client.query(
            "UPDATE apple_tokens SET updated_at = timestamptz 'epoch' + \(Int(EffectHarness.base)) * interval '1 millisecond' WHERE sub = 'early-1'")
        let late = try await apple.refreshToken(sub: "late-1")
        _ = try await Self.keep(late, sub: "late-1", in: h)
        let session = try await h.session(sub: "late-1", createdAt: 10_000)
        try await h.post("consent-revoked", sub: "early-1", at: 5_000)
        try await h.post("consent-revoked", sub: "late-1", at: 5_000)
        #expect(try await h.drain() == 2)

        // The newer sign-in's token and session stay; the older token went as before.
        #expect(try await h.activeSessions(sub: "late-1") == [session])
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'late-1'") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM apple_tokens WHERE sub = 'early-1'") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND sub = 'late-1'") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND sub = 'early-1'") == (revoke ? 1 : 0))
        #expect(try await Self.deliver(h) == (revoke ? 1 : 0))
        #expect(apple.revocations(of: late) == 0)
        #expect(apple.revocations(of: early) == (revoke ? 1 : 0))

        // The user's account deletion later revokes the token the late event spared.
        let erasure = try await AccountStore(client: h.client, logger: h.h.logs.logger()).erase(aud: Harness.aud, sub: "late-1", actor: "test")
        #expect(erasure.appleRevocations == 1)
        #expect(try await Self.deliver(h) == 1)
        #expect(apple.revocations(of: late) == 1)
        await h.stop()
        await apple.stop()
    }

    @Test("a revocation out of attempts keeps its token past the jobs' retention: the pruner leaves it, jobs_discarded names its lane, apple retry --discarded sends it at any age")
    func discardedRevocationOutlivesRetention() async throws {
        let apple = try await Apple.start(signer: Self.signer)
        let h = try await EffectHarness.start { configuration in
            configuration.lanes.apple = AppleRevocations(client: apple.client, cipher: Self.cipher)
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)
            configuration.queue.maxAttempts = 2
        }
        let token = try await apple.refreshToken(sub: "stuck-1")
        _ = try await Self.keep(token, sub: "stuck-1", in: h)
        _ = try await AccountStore(client: h.client, logger: h.h.logs.logger()).erase(aud: Harness.aud, sub: "stuck-1", actor: "test")
        apple.service.failNext(2, of: .revoke, status: 503)
        #expect(try await Self.deliver(h) == 1)
        #expect(try await Self.deliver(h) == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'discarded' AND payload IS NOT NULL") == 1)
        // A finished effect job beside it, which the same round does prune.
        try await h.post("email-enabled", sub: "other-1", at: 1_000, email: "other@privaterelay.appleid.com")
        #expect(try await h.drain() == 1)

        // The alert names the lane and what to run.
        var configuration = AlertMonitor.Configuration()
        configuration.rules.spike.window = .seconds(600)
        let monitor = AlertMonitor(
            configuration: configuration, store: AlertStore(client: h.client, logger: h.h.logs.logger()), logger: h.h.logs.logger(), identity: h.workers.identity)
        let fired = try await monitor.evaluate(now: Date()).compactMap { decision -> AlertEpisode? in
            if case .fire(let episode) = decision, episode.key.kind == .jobsDiscarded { episode } else { nil }
        }
        #expect(fired.map(\.key.type) == ["apple_revocations"], "\(fired)")
        let alert = try #require(try await AlertStore(client: h.client, logger: h.h.logs.logger()).open().first { $0.episode.key.kind == .jobsDiscarded })
        let subject = monitor.subject(alert.message)
        #expect(subject.contains("apple_revocations") && subject.contains("apple retry --discarded"), "\(subject)")

        // A year past the retention: the effect job goes, the revocation and its token stay.
        let later = Date().addingTimeInterval(365 * 86_400)
        #expect(try await h.workers.maintainer.runOnce(queueNow: later).pruned == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'discarded' AND payload IS NOT NULL") == 1)
        try await h.client.query("UPDATE jobs SET finished_at = now() - interval '400 days' WHERE lane = 'apple_revocations'")
        #expect(try await JobQueue(client: h.client, logger: h.h.logs.logger()).prune(retention: .seconds(86_400)) == 0)

        // Apple is back: the operator's retry finds it, and Apple takes it.
        #expect(try await JobQueue(client: h.client, logger: h.h.logs.logger()).retryAppleRevocations(id: nil, discarded: true) == 1)
        #expect(try await Self.deliver(h) == 1)
        #expect(apple.revocations(of: token) == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'completed' AND payload IS NULL") == 1)
        await h.stop()
        await apple.stop()
    }

    @Test("Apple refusing our client secret (invalid_client) is recorded, retried, and fires the apple_credentials alert")
    func refusedCredentialsAlert() async throws {
        let good = try await Apple.start(signer: Self.signer)
        let token = try await good.refreshToken(sub: "cred-1")
        await good.stop()
        let apple = try await Apple.start(signer: Self.signer, signingKey: P256.Signing.PrivateKey())
        let h = try await Self.harness(apple)
        _ = try await Self.keep(token, sub: "cred-1", in: h)
        _ = try await AccountStore(client: h.client, logger: h.h.logs.logger()).erase(aud: Harness.aud, sub: "cred-1", actor: "test")
        #expect(try await Self.deliver(h) == 1)
        #expect(try await h.h.count(
            "SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'retryable' AND last_status = 400 AND last_error LIKE '%invalid_client%'") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM apple_auth_calls WHERE error = 'invalid_client' AND status = 400") == 1)
        var configuration = AlertMonitor.Configuration()
        configuration.rules.spike.window = .seconds(600)
        let monitor = AlertMonitor(
            configuration: configuration, store: AlertStore(client: h.client, logger: h.h.logs.logger()), logger: h.h.logs.logger(), identity: h.workers.identity)
        let decisions = try await monitor.evaluate(now: Date())
        #expect(decisions.contains { if case .fire(let episode) = $0 { episode.key.kind == .appleCredentials } else { false } }, "\(decisions)")
        await h.stop()
        await apple.stop()
    }
}
