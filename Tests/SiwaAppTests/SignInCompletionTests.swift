import Crypto
import Foundation
import Logging
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaApple
import SiwaAppleStandIn
import SiwaDomain
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Synchronization
import Testing

/// `POST /v1/sessions` with an authorization code: the real server on a real database, its Apple
/// credentials pointing at the stand-in for Apple's auth endpoints (in process, over real HTTP,
/// signing id_tokens with the key the server trusts). The stand-in's clock is moved by hand.
@Suite("Sign-in completion: authorization codes exchanged at Apple", .timeLimit(.minutes(10)))
struct SignInCompletionTests {
    static let clientID = Harness.aud
    /// A Services ID (web sign-in) for the same app's accounts.
    static let webClientID = "com.example.web"

    @Test("a code alone, and a code with its identity token, open a session; the refresh token is kept only as ciphertext, the exchange recorded")
    func exchangeOpensSession() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite, .accountsRead])

        // The code alone: the user and the address come from the grant's id_token.
        let alone = f.code(sub: "001.alone.1", email: "alone@privaterelay.appleid.com", isPrivateEmail: true)
        let created = try await f.create(token, ["authorization_code": .string(alone)])
        #expect(created.status == 201, "\(created.body)")
        #expect(created.json?["aud"] == .string(Self.clientID) && created.json?["sub"] == .string("001.alone.1"), "\(created.body)")
        let account = try await API.call(f.h, .GET, "/v1/accounts/\(Self.clientID)/001.alone.1", token: token)
        #expect(account.json?["email"] == .string("alone@privaterelay.appleid.com") && account.json?["is_private_email"] == .bool(true), "\(account.body)")

        // The code with the app's identity token (and its nonce, checked on that token: the grant's need not carry it).
        let raw = "nonce-\(UUID().uuidString)"
        let identity = try f.h.signer.identityToken(aud: Self.clientID, sub: "001.both.1", nonce: IdentityTokenVerifier.nonceHash(raw))
        let both = f.code(sub: "001.both.1")
        let withToken = try await f.create(token, ["authorization_code": .string(both), "identity_token": .string(identity), "nonce": .string(raw)])
        #expect(withToken.status == 201, "\(withToken.body)")
        #expect(withToken.json?["sub"] == .string("001.both.1"))

        for (sub, code, answer) in [("001.alone.1", alone, created), ("001.both.1", both, withToken)] {
            let kept = try #require(try await f.keptTokens(sub: sub).first, "no apple_tokens row for \(sub)")
            #expect(try await f.keptTokens(sub: sub).count == 1)
            #expect(kept.clientID == Self.clientID)
            let refreshToken = try f.cipher.decrypt(kept.ciphertext, owner: AppleTokenOwner(aud: Self.clientID, sub: sub))
            #expect(refreshToken.hasPrefix("r") && refreshToken.count == 65, "not a refresh token of the stand-in")
            #expect(kept.fingerprint == AppleAuthRecord.fingerprint(refreshToken))
            #expect(try await DatabaseSearch.occurrences(of: refreshToken, in: f.h.server.client) == 0, "the refresh token is stored in clear")
            #expect(try await DatabaseSearch.occurrences(of: code, in: f.h.server.client) == 0, "the code is stored")
            #expect(!answer.body.contains(refreshToken) && !answer.body.contains(code))
            let calls = try await f.calls(sub: sub)
            #expect(calls.count == 1)
            #expect(calls.first?.endpoint == "/auth/token" && calls.first?.grantType == "authorization_code" && calls.first?.clientID == Self.clientID)
            #expect(calls.first?.fingerprint == AppleAuthRecord.fingerprint(code) && calls.first?.status == 200 && calls.first?.error == nil)
        }
        f.expectNoSecretsLogged(known: [alone, both, identity])
        await f.stop()
    }

    @Test("the workflow without HTTP: a code opens a session and keeps its token; another user's code is subMismatch and its grant revoked; an unknown aud is unknownBundleID")
    func workflowWithoutHTTP() async throws {
        let f = try await ExchangeFixture.start()
        let logger = f.h.logs.logger()
        let signIn = SignInCompletion(
            accounts: AccountStore(client: f.h.server.client, logger: logger), keys: f.h.server.application.keys, bundleIDs: [Self.clientID],
            clientIDs: [Self.clientID: Self.clientID, Self.webClientID: Self.clientID], clockSkew: .seconds(60),
            apple: AppleSignIn(
                gateway: AppleGateway(client: f.apple.credentials.client(), recorder: AppleTokenStore(client: f.h.server.client, logger: logger)),
                cipher: f.cipher))
        let expiresAt = Date().addingTimeInterval(3600)
        func code(_ code: String, identityToken: String? = nil) -> SignInRequest {
            SignInRequest(
                proof: .authorizationCode(code: code, redirectURI: nil, clientID: Self.clientID, identityToken: identityToken), expiresAt: expiresAt)
        }

        let opened = try await signIn.signIn(code(f.code(sub: "001.direct.1")), now: Date(), logger: logger)
        #expect(opened.session.aud == Self.clientID && opened.session.sub == "001.direct.1" && opened.keptAppleToken)
        #expect(try await f.keptTokens(sub: "001.direct.1").count == 1)

        let identity = try f.h.signer.identityToken(aud: Self.clientID, sub: "001.directA.1")
        await #expect {
            try await signIn.signIn(code(f.code(sub: "001.directB.1"), identityToken: identity), now: Date(), logger: logger)
        } throws: { error in
            guard case .subMismatch? = error as? SignInError else { return false }
            return true
        }
        #expect(f.standIn.revocations.map { "\($0.tokenTypeHint ?? "") \($0.outcome.word)" } == ["refresh_token revoked"])
        #expect(try await f.keptTokens(sub: "001.directB.1").isEmpty)
        #expect(try await f.keptTokens(sub: "001.directA.1").isEmpty)

        await #expect {
            try await signIn.signIn(SignInRequest(proof: .stated(aud: "com.example.other", sub: "001.x.1"), expiresAt: expiresAt), now: Date(), logger: logger)
        } throws: { error in
            guard case .unknownBundleID(let aud, let configured)? = error as? SignInError else { return false }
            return aud == "com.example.other" && configured == [Self.clientID]
        }
        await f.stop()
    }

    @Test("a used code is refused by Apple: 401 apple_refused naming invalid_grant; no second session, nothing more stored")
    func reusedCode() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite])
        let code = f.code(sub: "001.reused.1")
        #expect(try await f.create(token, ["authorization_code": .string(code)]).status == 201)
        let stored = try await f.stored(sub: "001.reused.1")
        #expect(stored == Stored(accounts: 1, sessions: 1, tokens: 1, calls: 1))
        let kept = try #require(try await f.keptTokens(sub: "001.reused.1").first)

        let again = try await f.create(token, ["authorization_code": .string(code)])
        #expect(again.status == 401, "\(again.body)")
        #expect(again.json?["error"] == .string("apple_refused") && again.json?["reason"] == .string("invalid_grant"), "\(again.body)")
        #expect(again.json?["message"]?.stringValue?.contains("already used, or expired") == true, "\(again.body)")
        #expect(try await f.stored(sub: "001.reused.1") == stored)
        #expect(try await f.keptTokens(sub: "001.reused.1").first?.ciphertext == kept.ciphertext, "the kept token changed")
        // What Apple refused is on record, by the code's fingerprint, with no user.
        let refused = try await f.refusedCalls()
        #expect(refused.map(\.error) == ["invalid_grant"] && refused.map(\.status) == [400], "\(refused)")
        #expect(refused.first?.fingerprint == AppleAuthRecord.fingerprint(code) && refused.first?.endpoint == "/auth/token")
        #expect(f.h.logs.all.contains { $0.contains("authorization code exchange failed") && $0.contains("error=invalid_grant") && $0.contains("token=sha256:\(AppleAuthRecord.fingerprint(code))") })
        f.expectNoSecretsLogged(known: [code])
        await f.stop()
    }

    @Test("an expired code is refused by Apple: 401 invalid_grant; no account, no session, nothing stored")
    func expiredCode() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite])
        let code = f.code(sub: "001.expired.1")
        f.clock.advance(by: 301)  // Apple's codes live 5 minutes
        let answer = try await f.create(token, ["authorization_code": .string(code)])
        #expect(answer.status == 401 && answer.json?["reason"] == .string("invalid_grant"), "\(answer.body)")
        #expect(try await f.stored(sub: "001.expired.1") == Stored())
        #expect(try await f.h.count("SELECT count(*) FROM apple_tokens") == 0)
        f.expectNoSecretsLogged(known: [code])
        await f.stop()
    }

    @Test("a client secret signed with another key under the same key ID: 502 naming invalid_client and the SIWA_APPLE_* credentials; no session")
    func wrongKey() async throws {
        let f = try await ExchangeFixture.start(serverKey: P256.Signing.PrivateKey())
        let token = try await API.token(f.h, [.sessionsWrite])
        let code = f.code(sub: "001.wrongkey.1")
        let answer = try await f.create(token, ["authorization_code": .string(code)])
        #expect(answer.status == 502, "\(answer.body)")
        #expect(answer.json?["error"] == .string("apple_refused") && answer.json?["reason"] == .string("invalid_client"), "\(answer.body)")
        let message = answer.json?["message"]?.stringValue ?? ""
        #expect(["invalid_client", "SIWA_APPLE_TEAM_ID", "SIWA_APPLE_KEY_ID", "SIWA_APPLE_PRIVATE_KEY_FILE"].allSatisfy(message.contains), "\(message)")
        #expect(answer.json?["request_id"]?.stringValue != nil)
        #expect(try await f.stored(sub: "001.wrongkey.1") == Stored())
        #expect(try await f.refusedCalls().map(\.error) == ["invalid_client"])  // what the apple_credentials alert counts
        #expect(f.h.logs.all.contains { $0.hasPrefix("warning authorization code exchange failed") && $0.contains("error=invalid_client") })
        f.expectNoSecretsLogged(known: [code])
        await f.stop()
    }

    @Test("an identity token of one user with a code of another: 401 invalid_token, reason sub_mismatch; neither user gets a session or a kept token; the granted refresh token is revoked")
    func subMismatch() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite])
        let identity = try f.h.signer.identityToken(aud: Self.clientID, sub: "001.userA.1")
        let code = f.code(sub: "001.userB.1")
        let answer = try await f.create(token, ["identity_token": .string(identity), "authorization_code": .string(code)])
        #expect(answer.status == 401, "\(answer.body)")
        #expect(answer.json?["error"] == .string("invalid_token") && answer.json?["reason"] == .string("sub_mismatch"), "\(answer.body)")
        #expect(try await f.stored(sub: "001.userA.1") == Stored())
        #expect(try await f.stored(sub: "001.userB.1") == Stored())
        #expect(try await f.h.count("SELECT count(*) FROM apple_tokens") == 0)
        // Apple granted a refresh token nobody keeps: revoked at once, and the call recorded.
        #expect(f.standIn.revocations.map { "\($0.tokenTypeHint ?? "") \($0.outcome.word)" } == ["refresh_token revoked"])
        #expect(try await f.h.count("SELECT count(*) FROM apple_auth_calls WHERE endpoint = '/auth/revoke' AND status = 200 AND sub IS NULL") == 1)
        f.expectNoSecretsLogged(known: [code, identity])
        await f.stop()
    }

    @Test("the client ID: the only configured one, else client_id (400 naming it when missing or unknown); a client_id against the identity token's aud is 400")
    func clientIDResolution() async throws {
        let f = try await ExchangeFixture.start(clientIDs: [Self.clientID: Self.clientID, Self.webClientID: Self.clientID])
        let token = try await API.token(f.h, [.sessionsWrite])
        let code = f.code(sub: "001.web.1", clientID: Self.webClientID, redirectURI: "https://example.com/callback")
        func refused(_ body: JSONValue, _ words: String) async throws {
            let answer = try await f.create(token, body)
            #expect(answer.status == 400 && answer.json?["error"] == .string("invalid_request"), "\(answer.body)")
            #expect(answer.json?["message"]?.stringValue?.contains(words) == true, "\(answer.body)")
        }
        try await refused(["authorization_code": .string(code)], "client_id is required")
        try await refused(["authorization_code": .string(code), "client_id": "com.example.other"], "client_id com.example.other is not one of SIWA_APPLE_CLIENT_IDS")
        let identity = try f.h.signer.identityToken(aud: Self.clientID, sub: "001.web.1")
        try await refused(["authorization_code": .string(code), "identity_token": .string(identity), "client_id": .string(Self.webClientID)], "is not the identity token's aud")
        try await refused(["aud": .string(Self.clientID), "sub": "u", "redirect_uri": "https://example.com/callback"], "unexpected field redirect_uri")
        // None of these reached Apple: the code is still good, for the web client with its redirect URI.
        let created = try await f.create(
            token, ["authorization_code": .string(code), "client_id": .string(Self.webClientID), "redirect_uri": "https://example.com/callback"])
        #expect(created.status == 201 && created.json?["aud"] == .string(Self.clientID), "\(created.body)")
        let kept = try await f.keptTokens(sub: "001.web.1")
        #expect(kept.map(\.clientID) == [Self.webClientID])
        #expect(try await f.calls(sub: "001.web.1").map(\.clientID) == [Self.webClientID])
        await f.stop()
    }

    @Test("a nonce sent with a code alone is checked on the grant's id_token: the app's nonce opens a session, another is 401 nonce_mismatch, keeps nothing and revokes the grant")
    func nonceWithCodeAlone() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite])
        let raw = "nonce-\(UUID().uuidString)"
        let good = f.code(sub: "001.nonce.1", nonce: IdentityTokenVerifier.nonceHash(raw))
        let created = try await f.create(token, ["authorization_code": .string(good), "nonce": .string(raw)])
        #expect(created.status == 201, "\(created.body)")
        let other = f.code(sub: "001.nonce.2", nonce: IdentityTokenVerifier.nonceHash(raw))
        let refused = try await f.create(token, ["authorization_code": .string(other), "nonce": "another-nonce"])
        #expect(refused.status == 401 && refused.json?["reason"] == .string("nonce_mismatch"), "\(refused.body)")
        #expect(try await f.stored(sub: "001.nonce.2") == Stored())
        #expect(f.standIn.revocations.map { "\($0.tokenTypeHint ?? "") \($0.outcome.word)" } == ["refresh_token revoked"])
        f.expectNoSecretsLogged(known: [good, other])
        await f.stop()
    }

    @Test("a code for an Apple ID that Apple deleted is 409 account_deleted, keeps nothing and revokes the grant; after consent-revoked, a new sign-in's code opens a session")
    func refusedSessionKeepsNothing() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite, .accountsRead])
        let workers = EffectWorkers(
            configuration: .init(), store: EffectStore(client: f.h.server.client, logger: f.h.logs.logger()), logger: f.h.logs.logger())
        let revokedAt = Date().addingTimeInterval(-60)
        #expect(try await f.h.server.post(jws: f.h.notification(type: "account-delete", sub: "001.deleted.1", eventTime: revokedAt)).status == 200)
        #expect(try await f.h.server.post(jws: f.h.notification(type: "consent-revoked", sub: "001.revoked.1", eventTime: revokedAt)).status == 200)
        while try await workers.effects[0].runOnce(now: nil).claimed > 0 {}

        let deleted = try await f.create(token, ["authorization_code": .string(f.code(sub: "001.deleted.1"))])
        #expect(deleted.status == 409 && deleted.json?["reason"] == .string("account_deleted"), "\(deleted.body)")
        #expect(try await f.stored(sub: "001.deleted.1") == Stored(accounts: 1))
        #expect(f.standIn.revocations.map { "\($0.tokenTypeHint ?? "") \($0.outcome.word)" } == ["refresh_token revoked"])

        // The code is Apple's proof of a sign-in now: its id_token, issued after the revocation, gives consent again.
        let signedIn = try await f.create(token, ["authorization_code": .string(f.code(sub: "001.revoked.1"))])
        #expect(signedIn.status == 201, "\(signedIn.body)")
        #expect(try await f.stored(sub: "001.revoked.1") == Stored(accounts: 1, sessions: 1, tokens: 1, calls: 1))
        let account = try await API.call(f.h, .GET, "/v1/accounts/\(Self.clientID)/001.revoked.1", token: token)
        #expect(account.json?["consent_given_at"]?.stringValue != nil, "\(account.body)")
        await f.stop()
    }

    @Test("without Apple credentials, authorization_code is 501 not_configured naming the SIWA_APPLE_* settings; nothing is stored")
    func notConfigured() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite])
        let answer = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["authorization_code": "c0123"])
        #expect(answer.status == 501, "\(answer.body)")
        #expect(answer.json?["error"] == .string("not_configured"))
        let message = answer.json?["message"]?.stringValue ?? ""
        #expect(["SIWA_APPLE_TEAM_ID", "SIWA_APPLE_KEY_ID", "SIWA_APPLE_PRIVATE_KEY_FILE", "SIWA_APPLE_TOKEN_KEYS"].allSatisfy(message.contains), "\(message)")
        #expect(try await h.count("SELECT count(*) FROM sessions") == 0)
        #expect(try await h.count("SELECT count(*) FROM accounts") == 0)
        await h.stop()
    }

    @Test("no code, refresh token, access token, id_token or client secret reaches a log line, whatever the outcome; Apple's 503 is our 503 with Retry-After")
    func nothingSecretLogged() async throws {
        let f = try await ExchangeFixture.start()
        let token = try await API.token(f.h, [.sessionsWrite])
        var codes: [String] = []
        let good = f.code(sub: "001.logs.1", email: "logs@example.com")
        codes.append(good)
        #expect(try await f.create(token, ["authorization_code": .string(good)]).status == 201)
        #expect(try await f.create(token, ["authorization_code": .string(good)]).status == 401)  // reused
        let other = try f.h.signer.identityToken(aud: Self.clientID, sub: "001.logs.2")
        #expect(try await f.create(token, ["authorization_code": .string(f.code(sub: "001.logs.3")), "identity_token": .string(other)]).status == 401)
        let unanswered = f.code(sub: "001.logs.4")
        codes.append(unanswered)
        f.standIn.failNext(1, of: .token, status: 503)
        let unavailable = try await f.create(token, ["authorization_code": .string(unanswered)])
        #expect(unavailable.status == 503 && unavailable.json?["reason"] == .string("apple_unavailable"), "\(unavailable.body)")
        #expect(unavailable.headers.first(name: "Retry-After") == "5")
        #expect(try await f.stored(sub: "001.logs.4") == Stored())

        let refreshToken = try f.cipher.decrypt(
            try #require(try await f.keptTokens(sub: "001.logs.1").first).ciphertext, owner: AppleTokenOwner(aud: Self.clientID, sub: "001.logs.1"))
        #expect(f.h.logs.all.filter { $0.contains("authorization code exchange failed") }.count == 2)  // the reuse and the 503
        f.expectNoSecretsLogged(known: codes + [refreshToken, other])
        await f.stop()
    }
}

/// What the database holds for one user.
struct Stored: Equatable {
    var accounts = 0
    var sessions = 0
    var tokens = 0
    var calls = 0
}

/// A server whose Apple credentials (team, key, auth URL, token keys) are set as a user sets them,
/// pointing at a stand-in of the same team.
struct ExchangeFixture {
    static let signer = try! AppleStyleSigner.generate()

    let h: Harness
    let apple: StandInCredentials
    var standIn: AppleAuthStandIn { apple.standIn }
    var clock: OffsetClock { apple.clock }
    var cipher: AppleTokenCipher { apple.credentials.tokenCipher }

    /// `serverKey`: the key the server signs client secrets with (default: the team's own).
    static func start(serverKey: P256.Signing.PrivateKey? = nil, clientIDs: [String: String]? = nil) async throws -> ExchangeFixture {
        let apple = try await StandInCredentials.start(
            signer: signer, clientIDs: [SignInCompletionTests.clientID, SignInCompletionTests.webClientID], serverKey: serverKey)
        let h = try await Harness.start(signer: signer) { config in
            config.appleCredentials = apple.credentials
            if let clientIDs { config.apple.clientIDs = clientIDs }
        }
        return ExchangeFixture(h: h, apple: apple)
    }

    func stop() async {
        await h.stop()
        await apple.stop()
    }

    /// A code for the user, as Apple hands one to the device at sign-in.
    func code(
        sub: String, email: String? = nil, isPrivateEmail: Bool? = nil, nonce: String? = nil, clientID: String = SignInCompletionTests.clientID,
        redirectURI: String? = nil
    ) -> String {
        standIn.issueCode(.init(clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, nonce: nonce, redirectURI: redirectURI))
    }

    func create(_ token: String, _ body: JSONValue) async throws -> TestServer.Answer {
        try await API.call(h, .POST, "/v1/sessions", token: token, body: body)
    }

    struct Kept {
        var clientID: String
        var ciphertext: String
        var fingerprint: String
    }

    func keptTokens(sub: String) async throws -> [Kept] {
        var kept: [Kept] = []
        for try await (clientID, ciphertext, fingerprint) in try await h.server.client.query(
            "SELECT client_id, token, fingerprint FROM apple_tokens WHERE sub = \(sub) ORDER BY client_id"
        ).decode((String, String, String).self) {
            kept.append(Kept(clientID: clientID, ciphertext: ciphertext, fingerprint: fingerprint))
        }
        return kept
    }

    struct Call {
        var endpoint: String
        var clientID: String
        var grantType: String?
        var fingerprint: String
        var status: Int?
        var error: String?
    }

    /// The refused calls on record: no user was verified, so none is named.
    func refusedCalls() async throws -> [Call] {
        var calls: [Call] = []
        for try await row in try await h.server.client.query(
            "SELECT endpoint, client_id, grant_type, token_fingerprint, status, error FROM apple_auth_calls WHERE sub IS NULL AND aud IS NULL ORDER BY id"
        ).decode((String, String, String?, String, Int?, String?).self) {
            calls.append(Call(endpoint: row.0, clientID: row.1, grantType: row.2, fingerprint: row.3, status: row.4, error: row.5))
        }
        return calls
    }

    func calls(sub: String) async throws -> [Call] {
        var calls: [Call] = []
        for try await row in try await h.server.client.query(
            "SELECT endpoint, client_id, grant_type, token_fingerprint, status, error FROM apple_auth_calls WHERE sub = \(sub) ORDER BY id"
        ).decode((String, String, String?, String, Int?, String?).self) {
            calls.append(Call(endpoint: row.0, clientID: row.1, grantType: row.2, fingerprint: row.3, status: row.4, error: row.5))
        }
        return calls
    }

    func stored(sub: String) async throws -> Stored {
        for try await row in try await h.server.client.query(
            """
            SELECT (SELECT count(*) FROM accounts WHERE sub = \(sub))::bigint, (SELECT count(*) FROM sessions WHERE sub = \(sub))::bigint,
                (SELECT count(*) FROM apple_tokens WHERE sub = \(sub))::bigint,
                (SELECT count(*) FROM apple_auth_calls WHERE sub = \(sub))::bigint
            """
        ).decode((Int, Int, Int, Int).self) {
            return Stored(accounts: row.0, sessions: row.1, tokens: row.2, calls: row.3)
        }
        return Stored()
    }

    /// No known secret in any server log line, nor anything shaped like the stand-in's codes and
    /// tokens (a letter and 64 hex digits) or like a JWS (client secrets, id_tokens).
    func expectNoSecretsLogged(known: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        let lines = h.logs.all
        #expect(lines.count > 0, sourceLocation: sourceLocation)
        let opaque = try! Regex("(?:^|[^A-Za-z0-9_-])[acr][0-9a-f]{64}(?:$|[^A-Za-z0-9_-])")
        let jws = try! Regex("eyJ[A-Za-z0-9_-]*\\.eyJ[A-Za-z0-9_-]*\\.")
        for line in lines {
            for secret in known { #expect(!line.contains(secret), "a secret in the log: \(line)", sourceLocation: sourceLocation) }
            #expect(line.firstMatch(of: opaque) == nil, "a code or token in the log: \(line)", sourceLocation: sourceLocation)
            #expect(line.firstMatch(of: jws) == nil, "a JWS in the log: \(line)", sourceLocation: sourceLocation)
        }
    }
}
