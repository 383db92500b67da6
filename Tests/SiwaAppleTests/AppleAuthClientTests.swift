import Crypto
import Foundation
import Hummingbird
import NIOCore
import NIOPosix
import SiwaApple
import SiwaDomain
import SiwaTestSupport
import Synchronization
import Testing

/// Apple's auth endpoints on loopback, reduced to what these tests need: records each request
/// exactly (path, content type, raw body) and answers with the replies the test queues.
final class AuthRecorder: Sendable {
    struct Request: Sendable {
        var path: String
        var contentType: String?
        var authorization: String?
        var body: String
        var fields: [String: String] { Dictionary(FormURLEncoding.decode(body)?.map { ($0.name, $0.value) } ?? [], uniquingKeysWith: { $1 }) }
        var fieldNames: [String] { FormURLEncoding.decode(body)?.map(\.name) ?? [] }
    }

    struct Reply: Sendable {
        var status: Int
        var body: String = ""
        var location: String? = nil
        var retryAfter: String? = nil
    }

    private final class Shared: Sendable {
        let state = Mutex<(replies: [Reply], requests: [Request])>(([], []))
    }

    private let shared: Shared
    private let task: Task<Void, any Error>
    let baseURL: URL

    private init(baseURL: URL, shared: Shared, task: Task<Void, any Error>) {
        self.baseURL = baseURL
        self.shared = shared
        self.task = task
    }

    static func start() async throws -> AuthRecorder {
        let shared = Shared()
        let router = Router()
        for path in ["/auth/token", "/auth/revoke", "/auth/usermigrationinfo", "/landing"] {
            router.post(RouterPath(path)) { request, _ -> Response in
                let body = try await request.body.collect(upTo: 1 << 20)
                let reply = shared.state.withLock { state in
                    state.requests.append(Request(
                        path: path, contentType: request.headers[.contentType], authorization: request.headers[.authorization], body: String(buffer: body)))
                    return state.replies.isEmpty ? Reply(status: 200) : state.replies.removeFirst()
                }
                var headers: HTTPFields = [.contentType: "application/json;charset=UTF-8"]
                if let location = reply.location { headers[.location] = location }
                if let retryAfter = reply.retryAfter { headers[.retryAfter] = retryAfter }
                return Response(status: .init(code: reply.status), headers: headers, body: .init(byteBuffer: ByteBuffer(string: reply.body)))
            }
        }
        let (port, task) = try await startLoopbackServer(router, label: "apple-auth-recorder")
        return AuthRecorder(baseURL: URL(string: "http://127.0.0.1:\(port)")!, shared: shared, task: task)
    }

    func reply(_ replies: Reply...) { shared.state.withLock { $0.replies.append(contentsOf: replies) } }
    var requests: [Request] { shared.state.withLock { $0.requests } }

    func stop() async {
        task.cancel()
        _ = await task.result
    }
}

/// A clock moved by hand: the token cache's reuse is decided by it, never by waiting.
final class StepClock: Sendable {
    private let value: Mutex<Date>
    init(_ start: Date) { value = Mutex(start) }
    var now: Date { value.withLock { $0 } }
    func advance(by seconds: TimeInterval) { value.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

@Suite("Apple's /auth/token, /auth/revoke and /auth/usermigrationinfo over real HTTP", .timeLimit(.minutes(10)))
struct AppleAuthClientTests {
    /// Shaped to need every escape: `+`, `/`, `=`, `&`, and the `.` `-` `_` Apple's tokens contain.
    static let awkward = "c0de.a+b/c=d&e-f_g"
    let now = Date(timeIntervalSince1970: 1_790_000_000)

    func withClient(
        timeout: Duration = .seconds(10), maximumResponseSize: Int = 64 * 1024,
        _ body: (AppleAuthClient, AuthRecorder, P256.Signing.PublicKey) async throws -> Void
    ) async throws {
        let recorder = try await AuthRecorder.start()
        let key = P256.Signing.PrivateKey()
        let minter = ClientSecretMinter(policy: try ClientSecretPolicy(teamID: "TEAM123456"), key: try .init(keyID: "KEY1234567", privateKey: key))
        let now = self.now
        let client = AppleAuthClient(
            configuration: .init(baseURL: recorder.baseURL, timeout: timeout, maximumResponseSize: maximumResponseSize), minter: minter, now: { now })
        try await withRecorder(recorder) { try await body(client, recorder, key.publicKey) }
    }

    func withRecorder(_ recorder: AuthRecorder, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch {
            await recorder.stop()
            throw error
        }
        await recorder.stop()
    }

    /// The client secret sent is ours, for this client ID, and verifies.
    func expectClientSecret(_ jwt: String?, clientID: String, key: P256.Signing.PublicKey) throws {
        let parts = try #require(jwt).split(separator: ".").map(String.init)
        try #require(parts.count == 3)
        #expect(JSONValue.parse(try #require(Base64URL.decode(parts[1])))?["sub"] == .string(clientID))
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: try #require(Base64URL.decode(parts[2])))
        #expect(key.isValidSignature(signature, for: Data((parts[0] + "." + parts[1]).utf8)))
    }

    @Test("exchange posts exactly client_id, client_secret, code, grant_type (form-encoded) and parses the 200")
    func exchange() async throws {
        try await withClient { client, recorder, key in
            recorder.reply(.init(status: 200, body: #"{"access_token":"a.b","token_type":"Bearer","expires_in":3600,"refresh_token":"r.0.x","id_token":"h.p.s"}"#))
            let call = await client.exchange(code: Self.awkward, clientID: "com.example.app")
            #expect(try call.result.get() == AppleTokenGrant(accessToken: "a.b", tokenType: "Bearer", expiresIn: 3600, refreshToken: "r.0.x", idToken: "h.p.s"))
            let sent = try #require(recorder.requests.first)
            #expect(recorder.requests.count == 1 && sent.path == "/auth/token")
            #expect(sent.contentType == "application/x-www-form-urlencoded")
            #expect(sent.fieldNames == ["client_id", "client_secret", "code", "grant_type"])
            #expect(sent.body.contains("&code=c0de.a%2Bb%2Fc%3Dd%26e-f_g&"), "\(sent.body)")
            #expect(sent.fields["code"] == Self.awkward && sent.fields["grant_type"] == "authorization_code" && sent.fields["client_id"] == "com.example.app")
            try expectClientSecret(sent.fields["client_secret"], clientID: "com.example.app", key: key)
            #expect(call.record == AppleAuthRecord(
                endpoint: .token, clientID: "com.example.app", grantType: .authorizationCode, tokenTypeHint: nil,
                tokenFingerprint: AppleAuthRecord.fingerprint(Self.awkward), status: 200, error: nil))
        }
    }

    @Test("a web exchange adds redirect_uri, percent-encoded")
    func exchangeWeb() async throws {
        try await withClient { client, recorder, _ in
            recorder.reply(.init(status: 200, body: #"{"access_token":"a","token_type":"Bearer","expires_in":3600}"#))
            _ = await client.exchange(code: "c", clientID: "com.example.web", redirectURI: "https://example.com/cb?a=1&b=2")
            let sent = try #require(recorder.requests.first)
            #expect(sent.fieldNames == ["client_id", "client_secret", "code", "grant_type", "redirect_uri"])
            #expect(sent.body.hasSuffix("&redirect_uri=https%3A%2F%2Fexample.com%2Fcb%3Fa%3D1%26b%3D2"))
        }
    }

    @Test("refresh posts grant_type=refresh_token with the token, and takes a 200 without refresh_token or id_token")
    func refresh() async throws {
        try await withClient { client, recorder, key in
            recorder.reply(.init(status: 200, body: #"{"access_token":"a","token_type":"Bearer","expires_in":3600}"#))
            let call = await client.refresh(refreshToken: Self.awkward, clientID: "com.example.app")
            #expect(try call.result.get().refreshToken == nil)
            let sent = try #require(recorder.requests.first)
            #expect(sent.path == "/auth/token" && sent.fieldNames == ["client_id", "client_secret", "grant_type", "refresh_token"])
            #expect(sent.fields["grant_type"] == "refresh_token" && sent.fields["refresh_token"] == Self.awkward)
            try expectClientSecret(sent.fields["client_secret"], clientID: "com.example.app", key: key)
            #expect(call.record.grantType == .refreshToken && call.record.status == 200)
        }
    }

    @Test("revoke posts token and token_type_hint to /auth/revoke; a bodiless 200 is success, recorded without the token")
    func revoke() async throws {
        try await withClient { client, recorder, key in
            let call = await client.revoke(token: Self.awkward, hint: .refreshToken, clientID: "com.example.app")
            #expect(throws: Never.self) { try call.result.get() }
            let sent = try #require(recorder.requests.first)
            #expect(sent.path == "/auth/revoke" && sent.fieldNames == ["client_id", "client_secret", "token", "token_type_hint"])
            #expect(sent.fields["token"] == Self.awkward && sent.fields["token_type_hint"] == "refresh_token")
            try expectClientSecret(sent.fields["client_secret"], clientID: "com.example.app", key: key)
            #expect(call.record == AppleAuthRecord(
                endpoint: .revoke, clientID: "com.example.app", grantType: nil, tokenTypeHint: .refreshToken,
                tokenFingerprint: AppleAuthRecord.fingerprint(Self.awkward), status: 200))
            #expect(!"\(call.record)".contains("c0de"))
        }
    }

    @Test("the migration token: client_credentials and scope user.migration to /auth/token, no Authorization header")
    func migrationToken() async throws {
        try await withClient { client, recorder, key in
            recorder.reply(.init(status: 200, body: #"{"access_token":"m.secret","token_type":"Bearer","expires_in":3600}"#))
            let call = await client.migrationAccessToken(clientID: "com.example.app")
            #expect(try call.result.get() == AppleMigrationToken(accessToken: "m.secret", expiresIn: 3600))
            let sent = try #require(recorder.requests.first)
            #expect(sent.path == "/auth/token" && sent.authorization == nil && sent.contentType == "application/x-www-form-urlencoded")
            #expect(sent.fieldNames == ["grant_type", "scope", "client_id", "client_secret"])
            #expect(sent.fields["grant_type"] == "client_credentials" && sent.fields["scope"] == "user.migration")
            try expectClientSecret(sent.fields["client_secret"], clientID: "com.example.app", key: key)
            #expect(call.record.grantType == .clientCredentials && call.record.scope == .userMigration && call.record.status == 200)
            #expect(!"\(call.record)".contains("m.secret"))
        }
    }

    @Test("transferSub posts sub and target with the Bearer to /auth/usermigrationinfo and reads transfer_sub")
    func transferSub() async throws {
        try await withClient { client, recorder, key in
            recorder.reply(.init(status: 200, body: #"{"transfer_sub":"000111.t.2222"}"#))
            let call = await client.transferSub(of: Self.awkward, target: "TEAMB23456", clientID: "com.example.app", accessToken: "m.a+b")
            #expect(try call.result.get() == "000111.t.2222")
            let sent = try #require(recorder.requests.first)
            #expect(recorder.requests.count == 1 && sent.path == "/auth/usermigrationinfo" && sent.authorization == "Bearer m.a+b")
            #expect(sent.fieldNames == ["sub", "target", "client_id", "client_secret"])
            #expect(sent.fields["sub"] == Self.awkward && sent.fields["target"] == "TEAMB23456" && sent.fields["client_id"] == "com.example.app")
            try expectClientSecret(sent.fields["client_secret"], clientID: "com.example.app", key: key)
            #expect(call.record == AppleAuthRecord(
                endpoint: .userMigrationInfo, clientID: "com.example.app", grantType: nil, tokenTypeHint: nil,
                tokenFingerprint: AppleAuthRecord.fingerprint(Self.awkward), status: 200, target: "TEAMB23456"))
        }
    }

    @Test("transferSub refuses, unsent, a target that is not a team ID, our own team, or an empty sub")
    func transferSubBadInput() async throws {
        try await withClient { client, recorder, _ in
            for (sub, target, why) in [("001.a.1", "teamb23456", "10 characters"), ("001.a.1", "TEAM123456", "is this team"), ("", "TEAMB23456", "sub")] {
                let call = await client.transferSub(of: sub, target: target, clientID: "com.example.app", accessToken: "m")
                guard case .failure(.invalidInput(let message)) = call.result else { Issue.record("\(call.result)"); continue }
                #expect(message.contains(why), "\(message)")
                #expect(call.record.status == nil)
            }
            #expect(recorder.requests.isEmpty)
        }
    }

    @Test("migratedUser posts transfer_sub with the Bearer and reads sub, email, is_private_email; a 400 is Apple's word")
    func migratedUser() async throws {
        try await withClient { client, recorder, _ in
            recorder.reply(
                .init(status: 200, body: #"{"sub":"001234.n.0001","email":"r@privaterelay.appleid.com","is_private_email":true}"#),
                .init(status: 400, body: #"{"error":"invalid_request"}"#))
            let call = await client.migratedUser(transferSub: "000111.t.2222", clientID: "com.example.app", accessToken: "m.1")
            #expect(try call.result.get() == AppleMigratedUser(sub: "001234.n.0001", email: "r@privaterelay.appleid.com", isPrivateEmail: true))
            let sent = try #require(recorder.requests.first)
            #expect(sent.path == "/auth/usermigrationinfo" && sent.authorization == "Bearer m.1")
            #expect(sent.fieldNames == ["transfer_sub", "client_id", "client_secret"] && sent.fields["transfer_sub"] == "000111.t.2222")
            #expect(call.record.tokenFingerprint == AppleAuthRecord.fingerprint("000111.t.2222") && call.record.target == nil)
            let revoked = await client.migratedUser(transferSub: "000111.t.3333", clientID: "com.example.app", accessToken: "m.1")
            #expect(throws: AppleAuthClient.Failure.apple(.invalidRequest)) { try revoked.result.get() }
            #expect(revoked.record.error == .invalidRequest)
        }
    }

    @Test("the token cache asks once, reuses the token until an hour less the margin, then asks again; forget drops it")
    func tokenCache() async throws {
        let recorder = try await AuthRecorder.start()
        let minter = ClientSecretMinter(policy: try ClientSecretPolicy(teamID: "TEAM123456"), key: try .init(keyID: "KEY1234567", privateKey: .init()))
        let clock = StepClock(now)
        let cache = MigrationTokenCache(
            client: AppleAuthClient(configuration: .init(baseURL: recorder.baseURL), minter: minter, now: { clock.now }), margin: 300,
            now: { clock.now })
        try await withRecorder(recorder) { () async throws in
            for n in 1...3 { recorder.reply(.init(status: 200, body: #"{"access_token":"m\#(n)","token_type":"Bearer","expires_in":3600}"#)) }
            let first = await cache.token(clientID: "com.example.app")
            #expect(try first.result.get().accessToken == "m1" && first.call?.record.status == 200)
            clock.advance(by: 3299)
            let reused = await cache.token(clientID: "com.example.app")
            #expect(try reused.result.get().accessToken == "m1" && reused.call == nil)
            clock.advance(by: 1)
            #expect(try await cache.token(clientID: "com.example.app").result.get().accessToken == "m2")
            cache.forget(clientID: "com.example.app")
            #expect(try await cache.token(clientID: "com.example.app").result.get().accessToken == "m3")
            #expect(recorder.requests.count == 3)
        }
    }

    @Test("a 400 invalid_grant is Apple's word, in the result and the record")
    func invalidGrant() async throws {
        try await withClient { client, recorder, _ in
            recorder.reply(.init(status: 400, body: #"{"error":"invalid_grant","error_description":"The code has expired or has been revoked."}"#))
            let call = await client.exchange(code: "used", clientID: "com.example.app")
            #expect(throws: AppleAuthClient.Failure.apple(.invalidGrant)) { try call.result.get() }
            #expect(call.record.status == 400 && call.record.error == .invalidGrant)
        }
    }

    @Test("a 500 is unrecognised with its status")
    func serverError() async throws {
        try await withClient { client, recorder, _ in
            recorder.reply(.init(status: 500, body: "oops"))
            let call = await client.revoke(token: "t", hint: .accessToken, clientID: "com.example.app")
            #expect(throws: AppleAuthClient.Failure.apple(.unrecognised(status: 500))) { try call.result.get() }
            #expect(call.record.status == 500 && call.record.error == .unrecognised(status: 500) && call.record.tokenTypeHint == .accessToken)
        }
    }

    @Test("a redirect is not followed: the 307 is the answer and its target never hears of the token")
    func noRedirect() async throws {
        try await withClient { client, recorder, _ in
            recorder.reply(.init(status: 307, location: recorder.baseURL.absoluteString + "/landing"))
            let call = await client.revoke(token: "t", hint: .refreshToken, clientID: "com.example.app")
            #expect(throws: AppleAuthClient.Failure.apple(.unrecognised(status: 307))) { try call.result.get() }
            #expect(recorder.requests.map(\.path) == ["/auth/revoke"])
        }
    }

    @Test("a 200 that is not a token answer, or larger than the limit, is a malformed answer")
    func malformedAnswers() async throws {
        try await withClient(maximumResponseSize: 1024) { client, recorder, _ in
            let oversized = #"{"access_token":"a","token_type":"Bearer","expires_in":3600,"pad":""# + String(repeating: "x", count: 2048) + #""}"#
            recorder.reply(.init(status: 200, body: "<html>ok</html>"), .init(status: 200, body: oversized))
            for _ in 0..<2 {
                let call = await client.exchange(code: "c", clientID: "com.example.app")
                #expect(throws: AppleAuthClient.Failure.malformedAnswer(status: 200)) { try call.result.get() }
                #expect(call.record.status == 200 && call.record.error == nil)
            }
        }
    }

    // No wall-clock bound: in the full suite the cooperative pool can be starved for seconds, and
    // what proves the timeout is that the call returns at all (the server never answers), saying so.
    @Test("an endpoint that accepts and never answers is a transport failure naming the call's timeout", .timeLimit(.minutes(1)))
    func timeout() async throws {
        let silent = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        defer { silent.close(promise: nil) }
        let minter = ClientSecretMinter(policy: try ClientSecretPolicy(teamID: "TEAM123456"), key: try .init(keyID: "KEY1234567", privateKey: .init()))
        let client = AppleAuthClient(
            configuration: .init(baseURL: URL(string: "http://127.0.0.1:\(silent.localAddress!.port!)")!, timeout: .milliseconds(300)), minter: minter)
        let call = await client.refresh(refreshToken: "r", clientID: "com.example.app")
        guard case .failure(.transport(let message)) = call.result else { Issue.record("\(call.result)"); return }
        #expect(message.contains("no answer within 300ms") || message.contains("deadlineExceeded"), "\(message)")
        #expect(call.record.status == nil && call.record.error == nil)
    }

    @Test("plain http is refused unless it is to loopback; nothing is sent")
    func plainHTTP() async throws {
        let minter = ClientSecretMinter(policy: try ClientSecretPolicy(teamID: "TEAM123456"), key: try .init(keyID: "KEY1234567", privateKey: .init()))
        let client = AppleAuthClient(configuration: .init(baseURL: URL(string: "http://appleid.apple.com")!), minter: minter)
        let call = await client.revoke(token: "t", hint: .refreshToken, clientID: "com.example.app")
        guard case .failure(.transport(let why)) = call.result else { Issue.record("\(call.result)"); return }
        #expect(why.contains("plain http only to a loopback address"))
    }
}
