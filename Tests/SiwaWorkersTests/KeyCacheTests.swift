import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import Synchronization
import Testing
import Logging

@Suite("Apple key set: cache, rotation, rate limit, outages", .timeLimit(.minutes(10)))
struct KeyCacheTests {
    static func document(_ signers: AppleStyleSigner...) throws -> Data {
        let keys = try signers.map { try JSONValue.parse($0.jwksDocument())!["keys"]!.arrayValue!.first! }
        return Data(JSONValue.object(["keys": .array(keys)]).jsonText.utf8)
    }

    @Test("A token signed with a newly rotated key triggers one refresh and is accepted")
    func rotation() async throws {
        let old = try AppleStyleSigner.generate()
        let new = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(old))
        let h = try await Harness.start(signer: new, jwksURL: apple.url)
        #expect(apple.fetches == 1)
        apple.serve(try Self.document(old, new))
        let answer = try await h.server.post(jws: try h.notification())
        #expect(answer.status == 200)
        #expect(apple.fetches == 2)
        // Known now: no further fetch.
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        #expect(apple.fetches == 2)
        await h.stop()
        await apple.stop()
    }

    @Test("100 forged kids cause at most one refresh and each gets 401 unknown_key, recorded; during the cooldown too; a 45 KB kid is logged and stored bounded")
    func forgedKidsRateLimited() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        // A cooldown no run outlasts: "during the cooldown" must not depend on how fast the machine is.
        let h = try await Harness.start(signer: signer, jwksURL: apple.url) { $0.apple.keys.unknownKidCooldown = .seconds(3600) }
        let before = apple.fetches
        let answers = try await withThrowingTaskGroup(of: TestServer.Answer.self) { group in
            for index in 0..<100 {
                let jws = try h.forged(header: ["kid": .string("forged-\(index)"), "alg": .string("RS256")])
                group.addTask { try await h.server.post(jws: jws) }
            }
            return try await group.reduce(into: [TestServer.Answer]()) { $0.append($1) }
        }
        #expect(apple.fetches - before == 1, "one refresh for all of them")
        #expect(answers.allSatisfy { $0.status == 401 && $0.json?["reason"] == .string("unknown_key") }, "\(answers.map(\.status))")
        // A forged kid of 45 KB during the cooldown (the key set was refreshed moments ago and
        // succeeded): not fetched for, refused as unknown_key and recorded, its kid bounded.
        let huge = (0..<3_000).map { _ in UUID().uuidString.prefix(15) }.joined()
        let late = try await h.server.post(jws: try h.forged(header: ["kid": .string(huge), "alg": .string("RS256")]))
        #expect(late.status == 401 && late.json?["reason"] == .string("unknown_key"), "\(late.status)")
        #expect(apple.fetches - before == 1)
        await h.flushRejections()
        // Counted for bad_signatures whether sampled or recorded.
        #expect(try await h.count("SELECT sum(recorded + sampled_out)::int FROM rejection_counts WHERE reason = 'unknown_key'") == 101)
        let rejected = try await RejectionStore(client: h.server.client, logger: h.logs.logger()).rejected(since: Date().addingTimeInterval(-600))
        #expect(BadSignaturesRule.count(rejected) == 101, "the bad_signatures alert counts forged kids")
        #expect(h.logs.all.contains { $0.contains("reason=unknown_key") && $0.contains("bytes]") }, "the late one's delivery line, its kid bounded")
        #expect(h.logs.all.allSatisfy { $0.utf8.count < 8_000 }, "a log line holds the forged kid whole")
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)

        // While Apple's key set cannot be fetched, an unknown kid may be a rotation: 503 with
        // Retry-After, and the log line names a bounded kid.
        apple.setFailing(true)
        #expect(await h.server.application.keys.refresh(reason: "test") == false)
        let unavailable = try await h.server.post(jws: try h.forged(header: ["kid": .string(huge + "-2"), "alg": .string("RS256")]))
        #expect(unavailable.status == 503 && unavailable.json?["error"] == .string("unavailable"))
        #expect(unavailable.headers.first(name: "retry-after").flatMap(Int.init).map { $0 > 0 } == true)
        #expect(h.logs.all.contains { $0.contains("could not be fetched") && $0.contains("bytes]") })
        #expect(h.logs.all.allSatisfy { $0.utf8.count < 8_000 }, "a log line holds the forged kid whole")
        apple.setFailing(false)
        // Genuine traffic is unaffected.
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        await h.stop()
        await apple.stop()
    }

    @Test("A kid that leaves Apple's key set becomes unknown_key after the next refresh: a token it signed is refused 401, never checked against another key")
    func retiredKid() async throws {
        let old = try AppleStyleSigner.generate()
        let new = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(old, new))
        let h = try await Harness.start(signer: old, jwksURL: apple.url)
        let signedByOld = try h.notification(jti: "old-key-1")
        #expect(try await h.server.post(jws: signedByOld).status == 200)
        apple.serve(try Self.document(new))
        #expect(await h.server.application.keys.runOnce() == .fetched)
        let late = try await h.server.post(jws: try h.notification(jti: "old-key-2"))
        #expect(late.status == 401 && late.json?["reason"] == .string("unknown_key"), "\(late.status) \(late.body)")
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE jti = 'old-key-2'") == 0)
        await h.stop()
        await apple.stop()
    }

    @Test("The scheduled refresh picks up a rotated key before any token names it; a failed one keeps the set")
    func scheduledRefresh() async throws {
        let old = try AppleStyleSigner.generate()
        let new = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(old))
        let h = try await Harness.start(signer: new, jwksURL: apple.url)
        #expect(apple.fetches == 1)
        apple.serve(try Self.document(old, new))
        #expect(await h.server.application.keys.runOnce() == .fetched)
        #expect(apple.fetches == 2)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        #expect(apple.fetches == 2, "the key was known: no unknown-kid refresh")
        apple.setFailing(true)
        #expect(await h.server.application.keys.runOnce() == .failed)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        await h.stop()
        await apple.stop()
    }

    @Test("The unknown-kid cooldown ends: no fetch during it (401 after a good refresh, 503 after a failed one), one fetch for the first unknown kid after it")
    func unknownKidCooldownEnds() async throws {
        let signer = try AppleStyleSigner.generate()
        let rotated = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        let clock = TestClock()
        let keys = AppleKeyCache(
            configuration: .init(sourceURL: apple.url, unknownKidCooldown: .seconds(60)), persistence: nil, logger: Logger(label: "keys"),
            clock: { clock.now })
        await keys.load()
        #expect(apple.fetches == 1)
        func outcome(_ kid: String) async -> String {
            switch await keys.resolve(kid: kid) {
            case .key: "key"
            case .unknown: "unknown"
            case .unavailable(let retryAfter, _): "unavailable \(retryAfter.milliseconds / 1000)s"
            }
        }
        #expect(await outcome("forged-1") == "unknown")
        #expect(apple.fetches == 2)
        clock.advance(.seconds(59))
        #expect(await outcome("forged-2") == "unknown", "refreshed 59 s ago and it succeeded: not Apple's")
        #expect(apple.fetches == 2)
        apple.serve(try Self.document(signer, rotated))
        clock.advance(.seconds(1))
        #expect(await outcome(rotated.kid) == "key", "the cooldown is over: fetched")
        #expect(apple.fetches == 3)
        #expect(await outcome("forged-3") == "unknown")
        #expect(apple.fetches == 3)
        // A failed refresh during the cooldown: an unknown kid may be Apple's, retry later.
        apple.setFailing(true)
        #expect(await keys.refresh(reason: "scheduled") == false)
        #expect(await outcome("forged-4") == "unavailable 60s")
        #expect(apple.fetches == 4)
        await apple.stop()
    }

    @Test("A failed fetch keeps the last good key set")
    func lastGoodSet() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        let h = try await Harness.start(signer: signer, jwksURL: apple.url)
        apple.setFailing(true)
        let refreshed = await h.server.application.keys.refresh(reason: "test")
        #expect(refreshed == false)
        #expect(h.server.application.keys.isLoaded)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        apple.serve(Data("not a key set".utf8))
        apple.setFailing(false)
        #expect(await h.server.application.keys.refresh(reason: "test") == false)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        await h.stop()
        await apple.stop()
    }

    @Test("A stored key set past SIWA_JWKS_MAX_AGE while Apple is down: it still verifies, readiness fails, the log says why")
    func staleKeySetFailsReadiness() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        let database = try await TestCluster.shared.makeDatabase()
        let first = try await Harness.start(signer: signer, jwksURL: apple.url, database: database)
        // Fetched four days ago; Apple is down since.
        _ = try await first.count("WITH u AS (UPDATE jwks_cache SET fetched_at = now() - interval '4 days' RETURNING 1) SELECT count(*) FROM u")
        await first.stop()
        apple.setFailing(true)
        let second = try await Harness.start(signer: signer, jwksURL: apple.url, database: database)
        #expect(try await second.server.post(jws: try second.notification()).status == 200)
        let ready = try await second.server.request(.GET, "/health/ready")
        #expect(ready.status == 503 && ready.json?["checks"]?["apple_keys"] == .string("unavailable"), "\(ready.status)")
        #expect(second.server.application.keys.notLoadedReason?.contains("past SIWA_JWKS_MAX_AGE (72 h)") == true)
        #expect(second.logs.all.contains { $0.contains("apple keys unusable") && $0.contains("SIWA_JWKS_MAX_AGE") })
        // Apple is back: the next refresh makes it ready again.
        apple.setFailing(false)
        #expect(await second.server.application.keys.runOnce() == .fetched)
        #expect(try await second.server.request(.GET, "/health/ready").status == 200)
        await second.stop()
        await apple.stop()
    }

    @Test("The key-set fetch follows http(s) redirects only: never to file:, never more than 3 hops, never from https down to http; plain http only to loopback")
    func keySetRedirects() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(
            document: try Self.document(signer),
            redirects: ["/hop": "/auth/keys", "/file": "file:///etc/passwd", "/loop": "/loop", "/away": "http://192.0.2.1/auth/keys"])
        let fetcher = DefaultKeySetFetcher(timeout: .seconds(5))
        #expect(try AppleKeySet.parse(try await fetcher.fetch(apple.url("/hop"))).kids == [signer.kid])
        await #expect(throws: DefaultKeySetFetcher.FetchError.self) { try await fetcher.fetch(apple.url("/file")) }
        await #expect(throws: DefaultKeySetFetcher.FetchError.self) { try await fetcher.fetch(apple.url("/loop")) }
        // A redirect to plain http off this machine: refused before connecting.
        do {
            _ = try await fetcher.fetch(apple.url("/away"))
            Issue.record("followed a redirect to http://192.0.2.1")
        } catch {
            #expect("\(error)".contains("plain http only to a loopback address"), "\(error)")
        }
        // From https, http is a downgrade (the decision; the suite has no trusted TLS server).
        let https = URL(string: "https://keys.example/auth/keys")!
        #expect(throws: KeySetRedirect.Refusal.downgrade(to: "http://keys.example/auth/keys")) {
            try KeySetRedirect.next(from: https, location: "http://keys.example/auth/keys", hop: 1)
        }
        #expect(try KeySetRedirect.next(from: https, location: "/v2/keys", hop: 1).absoluteString == "https://keys.example/v2/keys")
        #expect(LoopbackHost.allowsCalls(to: URL(string: "http://127.0.0.1:9/k")!) && !LoopbackHost.allowsCalls(to: URL(string: "http://127.evil.example/k")!))
        #expect(LoopbackHost.allowsCalls(to: https) && !LoopbackHost.allowsCalls(to: URL(string: "file:///etc/k")!))
        await apple.stop()
    }

    @Test("After a restart with the key server down, the persisted set for the same URL verifies; a set from another URL is never used")
    func restartWhileAppleIsDown() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        let database = try await TestCluster.shared.makeDatabase()
        let first = try await Harness.start(signer: signer, jwksURL: apple.url, database: database)
        #expect(try await first.server.post(jws: try first.notification()).status == 200)
        await first.stop()

        apple.setFailing(true)
        let second = try await Harness.start(signer: signer, jwksURL: apple.url, database: database)
        #expect(try await second.server.request(.GET, "/health/ready").status == 200)
        #expect(try await second.server.post(jws: try second.notification()).status == 200)
        await second.stop()

        // Same database, another URL (which is down): the stored set is not borrowed.
        let otherURL = URL(string: apple.url.absoluteString.replacingOccurrences(of: "/auth/keys", with: "/auth/keys?other"))!
        let third = try await Harness.start(signer: signer, jwksURL: otherURL, database: database)
        #expect(try await third.server.request(.GET, "/health/ready").status == 503)
        let answer = try await third.server.post(jws: try third.notification())
        #expect(answer.status == 503)
        #expect(answer.headers.first(name: "retry-after") != nil)
        await third.stop()
        await apple.stop()
    }
}

/// A clock the test moves by hand.
final class TestClock: Sendable {
    private let instant = Mutex(ContinuousClock.now)
    var now: ContinuousClock.Instant { instant.withLock { $0 } }
    func advance(_ by: Duration) { instant.withLock { $0 += by } }
}

extension JSONValue {
    var arrayValue: [JSONValue]? {
        if case .array(let values) = self { return values }
        return nil
    }
}
