import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaApp
import SiwaDomain
import SiwaHTTP
import SiwaKeys
import SiwaTestSupport
import Synchronization
import Testing
import Logging

@Suite("Apple key set: cache, rotation, rate limit, outages")
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

    @Test("100 forged kids cause at most one refresh: 401 unknown_key after it, 503 with Retry-After during the cooldown")
    func forgedKidsRateLimited() async throws {
        let signer = try AppleStyleSigner.generate()
        let apple = try await JWKSServer.start(document: try Self.document(signer))
        let h = try await Harness.start(signer: signer, jwksURL: apple.url)
        let before = apple.fetches
        let answers = try await withThrowingTaskGroup(of: TestServer.Answer.self) { group in
            for index in 0..<100 {
                let jws = try h.forged(header: ["kid": .string("forged-\(index)"), "alg": .string("RS256")])
                group.addTask { try await h.server.post(jws: jws) }
            }
            return try await group.reduce(into: [TestServer.Answer]()) { $0.append($1) }
        }
        #expect(apple.fetches - before == 1, "one refresh for all of them")
        #expect(answers.allSatisfy { $0.status == 401 || $0.status == 503 })
        #expect(answers.contains { $0.status == 401 && $0.json?["reason"] == .string("unknown_key") })
        // One more forged kid, during the cooldown: not fetched for, 503 with Retry-After.
        let late = try await h.server.post(jws: try h.forged(header: ["kid": .string("forged-late"), "alg": .string("RS256")]))
        #expect(late.status == 503)
        #expect(apple.fetches - before == 1)
        let unavailable = answers.filter { $0.status == 503 } + [late]
        #expect(unavailable.allSatisfy { $0.headers.first(name: "retry-after").flatMap(Int.init).map { $0 > 0 } == true })
        #expect(unavailable.allSatisfy { $0.json?["error"] == .string("unavailable") })
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        // Genuine traffic is unaffected.
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
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

    @Test("The unknown-kid cooldown ends: no fetch during it, one fetch for the first unknown kid after it")
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
        #expect(await outcome("forged-2") == "unavailable 1s")
        #expect(apple.fetches == 2)
        apple.serve(try Self.document(signer, rotated))
        clock.advance(.seconds(1))
        #expect(await outcome(rotated.kid) == "key", "the cooldown is over: fetched")
        #expect(apple.fetches == 3)
        #expect(await outcome("forged-3") == "unavailable 60s")
        #expect(apple.fetches == 3)
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
