import Crypto
import Foundation
import SiwaApple
import SiwaDomain
import Synchronization
import Testing

/// A clock that never waits: a sleep moves it to the deadline and is remembered.
final class ManualClock: Clock, Sendable {
    struct Instant: InstantProtocol {
        var offset: Duration
        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private let state = Mutex<(now: Instant, slept: [Duration])>((Instant(offset: .zero), []))
    var now: Instant { state.withLock { $0.now } }
    var minimumResolution: Duration { .zero }
    /// Each sleep's length, in order.
    var slept: [Duration] { state.withLock { $0.slept } }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        state.withLock { state in
            guard deadline > state.now else { return }
            state.slept.append(state.now.duration(to: deadline))
            state.now = deadline
        }
    }
}

/// What the gateway recorded, in order (the store's conformance is tested through PostgreSQL in
/// the sign-in, revocation, validation and transfer suites).
final class RecordedCalls: AppleCallRecorder {
    private let calls = Mutex<[(AppleAuthRecord, AppleCallSubject)]>([])
    var all: [(record: AppleAuthRecord, subject: AppleCallSubject)] { calls.withLock { $0.map { ($0.0, $0.1) } } }

    func record(_ call: AppleAuthRecord, about subject: AppleCallSubject) async throws -> Int {
        calls.withLock { $0.append((call, subject)); return $0.count }
    }
}

@Suite("The gateway to Apple: every sent call recorded, one pacing and 429 policy on an injected clock", .timeLimit(.minutes(10)))
struct AppleGatewayTests {
    func withGateway(perSecond: Double? = nil, _ body: (AppleGateway, AuthRecorder, RecordedCalls, ManualClock) async throws -> Void) async throws {
        let recorder = try await AuthRecorder.start()
        let minter = ClientSecretMinter(
            policy: try ClientSecretPolicy(teamID: "TEAM123456"), key: try .init(keyID: "KEY1234567", privateKey: P256.Signing.PrivateKey()))
        let client = AppleAuthClient(configuration: .init(baseURL: recorder.baseURL), minter: minter)
        let (calls, clock) = (RecordedCalls(), ManualClock())
        let gateway = AppleGateway(client: client, recorder: calls, pacer: ApplePacer(perSecond: perSecond, clock: clock))
        try await AppleAuthClientTests().withRecorder(recorder) { try await body(gateway, recorder, calls, clock) }
    }

    @Test("calls at a rate are spaced 1/rate apart on the clock; an unpaced gateway never waits")
    func pacing() async throws {
        let clock = ManualClock()
        let pacer = ApplePacer(perSecond: 4, clock: clock)
        for _ in 0..<3 { try await pacer.admit() }
        #expect(clock.slept == [.milliseconds(250), .milliseconds(250)])
        let unpaced = ManualClock()
        let free = ApplePacer(perSecond: nil, clock: unpaced)
        for _ in 0..<3 { try await free.admit() }
        #expect(unpaced.slept.isEmpty)
    }

    @Test("a 429 pauses the next call for Apple's Retry-After, then it is sent again; both attempts recorded with their subject")
    func rateLimitedThenAnswered() async throws {
        try await withGateway { gateway, apple, calls, clock in
            apple.reply(.init(status: 429, retryAfter: "3"), .init(status: 200))
            let subject = AppleCallSubject(aud: "com.example.app", sub: "001.a.1", jobID: 7)
            let call = try await gateway.revoke(token: "t", hint: .refreshToken, clientID: "com.example.app", about: subject)
            #expect((try? call.result.get()) != nil)
            #expect(apple.requests.count == 2)
            #expect(clock.slept == [.seconds(3)])
            #expect(calls.all.map(\.record.status) == [429, 200])
            #expect(calls.all.allSatisfy { $0.subject == subject })
            #expect(call.recordID == 2)
        }
    }

    @Test("Apple still limiting after five attempts: the fifth 429 is the answer, each pause the default second; nothing else is sent")
    func rateLimitedThroughout() async throws {
        try await withGateway { gateway, apple, calls, clock in
            for _ in 0..<6 { apple.reply(.init(status: 429)) }
            let call = try await gateway.refresh(refreshToken: "r", clientID: "com.example.app", about: .none)
            #expect(call.call.isRateLimited)
            #expect(apple.requests.count == AppleGateway.rateLimitedAttempts)
            #expect(clock.slept == Array(repeating: .seconds(1), count: AppleGateway.rateLimitedAttempts - 1))
            #expect(calls.all.count == AppleGateway.rateLimitedAttempts)
        }
    }

    @Test("a migration call records the access token's fetch once, then reuses it; a call refused before sending is not sent or recorded")
    func unsentAndMigration() async throws {
        try await withGateway(perSecond: 10) { gateway, apple, calls, clock in
            apple.reply(
                .init(status: 200, body: #"{"access_token":"m.1","token_type":"Bearer","expires_in":3600}"#),
                .init(status: 200, body: #"{"transfer_sub":"t.1"}"#), .init(status: 200, body: #"{"transfer_sub":"t.2"}"#))
            #expect(try await gateway.transferSub(of: "001.a.1", target: "ABCDE12345", clientID: "com.example.app").result.get() == "t.1")
            #expect(try await gateway.transferSub(of: "001.a.2", target: "ABCDE12345", clientID: "com.example.app").result.get() == "t.2")
            #expect(calls.all.map(\.record.endpoint) == [.token, .userMigrationInfo, .userMigrationInfo])
            #expect(clock.slept == [.milliseconds(100)], "the second transfer call waited its slot")
            let refused = try await gateway.transferSub(of: "", target: "ABCDE12345", clientID: "com.example.app")
            #expect(refused.recordID == nil && apple.requests.count == 3 && calls.all.count == 3)
        }
    }
}
