import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import Testing

/// The backend API through real HTTP on a real database.
@Suite("Backend API: tokens, sessions, accounts, erasure", .timeLimit(.minutes(10)))
struct BackendAPITests {
    @Test("every /v1 route needs a live token: missing, malformed, unknown, expired and revoked are 401; a missing scope is 403 naming it")
    func authentication() async throws {
        let h = try await Harness.start()
        let reader = try await API.token(h, [.sessionsRead], name: "reader")
        let path = "/v1/sessions/\(UUID().uuidString)"
        for token in [nil, "not-a-token", APIToken.generate()] as [String?] {
            let answer = try await API.call(h, .GET, path, token: token)
            #expect(answer.status == 401)
            #expect(answer.json?["error"] == .string("unauthorized"))
        }
        #expect(try await API.call(h, .GET, path, token: reader).status == 404)  // authenticated; no such session
        let denied = try await API.call(h, .POST, "/v1/sessions", token: reader, body: ["aud": "com.example.app", "sub": "u"])
        #expect(denied.status == 403)
        #expect(denied.json?["error"] == .string("forbidden"))
        #expect(denied.json?["message"]?.stringValue?.contains("sessions:write") == true)

        let expired = try await API.token(h, [.admin], expiresAt: Date().addingTimeInterval(-1))
        #expect(try await API.call(h, .GET, path, token: expired).status == 401)
        let store = TokenStore(client: h.server.client, logger: h.logs.logger())
        #expect(try await store.revoke("reader", actor: "test") == "reader")
        #expect(try await API.call(h, .GET, path, token: reader).status == 401)
        // Every /v1 route the admin listener registers, whatever its scope: no token and a revoked
        // token (one that could do anything before) are both 401 before the route runs.
        let everything = try await API.token(h, [.admin], name: "everything")
        #expect(try await store.revoke("everything", actor: "test") == "everything")
        let routes = h.server.application.adminRouter(methodNotAllowed: false).routes.filter { $0.path.description.hasPrefix("/v1/") }
        #expect(routes.count >= 10, "\(routes.map(\.path))")
        for route in routes {
            let concrete = route.path.description.split(separator: "/").map { segment -> String in
                guard segment.hasPrefix("{") else { return String(segment) }
                return segment == "{id}" ? UUID().uuidString : segment == "{aud}" ? Harness.aud : "001.probe.1"
            }.joined(separator: "/")
            let body: JSONValue? = route.method == .post ? ["aud": .string(Harness.aud), "sub": "001.probe.1"] : nil
            for token in [nil, everything] as [String?] {
                let answer = try await API.call(h, HTTPMethod(rawValue: route.method.rawValue), "/\(concrete)", token: token, body: body)
                #expect(answer.status == 401, "\(route.method) \(route.path) with \(token == nil ? "no token" : "a revoked token"): \(answer.status) \(answer.body)")
                #expect(answer.json?["error"] == .string("unauthorized"))
            }
        }
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '001.probe.1'") == 0)
        // Stored as a hash only: the token text is nowhere in the database.
        #expect(try await DatabaseSearch.occurrences(of: reader, in: h.server.client) == 0)
        let actions = try await store.audit(limit: 10).map(\.action)
        #expect(actions.contains("token.create") && actions.contains("token.revoke"))
        // Open routes stay open.
        #expect(try await h.server.request(.GET, "/health/live").status == 200)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        #expect(try await h.server.request(.GET, "/metrics").status == 200)
        await h.stop()
    }

    @Test("with SIWA_METRICS_TOKEN, /metrics needs it")
    func metricsToken() async throws {
        let secret = "metrics-secret-0123456789"
        let h = try await Harness.start { $0.http.metricsToken = secret }
        #expect(try await h.server.request(.GET, "/metrics").status == 401)
        #expect(try await h.server.request(.GET, "/metrics", headers: [("Authorization", "Bearer wrong-secret-0123456789")]).status == 401)
        #expect(try await h.server.request(.GET, "/metrics", headers: [("Authorization", "Bearer \(secret)")]).status == 200)
        await h.stop()
    }

    @Test("SIWA_SESSION_TTL sets a new session's expires_at; SIWA_CLOCK_SKEW decides how far in the future an identity token's iat may be")
    func sessionTTLAndClockSkew() async throws {
        for (ttl, skew) in [(Duration.seconds(3600), Duration.seconds(60)), (.seconds(7 * 86_400), .seconds(300))] {
            let h = try await Harness.start { config in
                config.sessionTTL = ttl
                config.apple.clockSkew = skew
            }
            let token = try await API.token(h, [.sessionsWrite])
            let before = Date()
            let created = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": "com.example.app", "sub": "001.ttl.1"])
            let expiresAt = try #require(created.json?["expires_at"]?.stringValue.flatMap { try? Date($0, strategy: .iso8601) })
            let lifetime = expiresAt.timeIntervalSince(before)
            #expect(lifetime > ttl.timeInterval - 60 && lifetime < ttl.timeInterval + 60, "TTL \(ttl): expires in \(lifetime) s")
            // An identity token issued 120 s from now: beyond a 60 s allowance, within a 300 s one.
            let ahead = try h.signer.identityToken(aud: Harness.aud, sub: "001.skew.1", issuedAt: Date().addingTimeInterval(120))
            let answer = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(ahead)])
            if skew < .seconds(120) {
                #expect(answer.status == 401 && answer.json?["reason"] == .string("not_yet_valid"), "skew \(skew): \(answer.body)")
            } else {
                #expect(answer.status == 201, "skew \(skew): \(answer.body)")
            }
            await h.stop()
        }
    }

    @Test("sessions the backend vouches for: create (201), read, log out (idempotent); bad input names the field")
    func vouchedSessions() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite, .sessionsRead])
        let created = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": "com.example.app", "sub": "001.vouched.1"])
        #expect(created.status == 201)
        let session = try #require(created.json)
        let id = try #require(session["id"]?.stringValue)
        #expect(UUID(uuidString: id) != nil)
        #expect(session["active"] == .bool(true))
        #expect(session["sub"] == .string("001.vouched.1"))
        #expect(session["created_at"]?.stringValue?.hasSuffix("Z") == true)
        #expect(session["expires_at"]?.stringValue != nil)  // SIWA_SESSION_TTL by default

        let read = try await API.call(h, .GET, "/v1/sessions/\(id)", token: token)
        #expect(read.status == 200 && read.json?["active"] == .bool(true))
        let logout = try await API.call(h, .DELETE, "/v1/sessions/\(id)", token: token)
        #expect(logout.status == 200)
        #expect(logout.json?["active"] == .bool(false))
        #expect(logout.json?["revoked_reason"] == .string("logout"))
        let again = try await API.call(h, .DELETE, "/v1/sessions/\(id)", token: token)
        #expect(again.json?["revoked_at"] == logout.json?["revoked_at"])

        func rejected(_ body: JSONValue, _ words: String) async throws {
            let answer = try await API.call(h, .POST, "/v1/sessions", token: token, body: body)
            #expect(answer.status == 400, "\(body.jsonText)")
            #expect(answer.json?["error"] == .string("invalid_request"))
            #expect(answer.json?["message"]?.stringValue?.contains(words) == true, "\(answer.body)")
        }
        try await rejected(["aud": "com.example.other", "sub": "u"], "aud com.example.other is not one of SIWA_APPLE_BUNDLE_IDS")
        try await rejected(["aud": "com.example.app"], "sub must be")
        try await rejected(["aud": "com.example.app", "sub": "u", "expires": "2030-01-01T00:00:00Z"], "unexpected field expires")
        try await rejected(["aud": "com.example.app", "sub": "u", "expires_at": "2001-01-01T00:00:00Z"], "expires_at must be in the future")
        try await rejected(["aud": "com.example.app", "sub": "u", "expires_at": "tomorrow"], "expires_at must be an ISO-8601 time")
        try await rejected(["identity_token": "x", "sub": "u"], "unexpected field sub")
        let wrongType = try await h.server.request(.POST, "/v1/sessions", body: "aud=x", headers: [("Content-Type", "text/plain"), ("Authorization", "Bearer \(token)")])
        #expect(wrongType.status == 415)
        let huge = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": .string(String(repeating: "a", count: 70_000)), "sub": "u"])
        #expect(huge.status == 413)
        let badID = try await API.call(h, .GET, "/v1/sessions/not-a-uuid", token: token)
        #expect(badID.status == 400 && badID.json?["message"]?.stringValue?.contains("not-a-uuid") == true)
        #expect(try await API.call(h, .GET, "/v1/sessions/\(UUID().uuidString)", token: token).status == 404)
        await h.stop()
    }

    /// A harness that knows Apple's real keys, accepts the fixture's client ID for com.example.app,
    /// and checks identity tokens at `at`.
    static func realTokenHarness(at: Date, clientIDs: String = "com.example.app,de.lunaone.sign-in-with-apple-example=com.example.app") async throws -> Harness {
        // Parsed as SIWA_APPLE_CLIENT_IDS is; a value it refuses fails the test here.
        let parsed = try AppleSettings(
            SettingSource(environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_CLIENT_IDS": clientIDs]), receiving: true).clientIDs
        return try await Harness.start(jwksURL: try Harness.appleFixture("jwks.json"), fixedTime: at) { config in
            config.apple.clientIDs = parsed
        }
    }

    static func identityToken() throws -> (jws: String, iat: Date) {
        let object = try #require(JSONValue.parse(Data(contentsOf: Harness.appleFixture("identity-token.json"))))
        let jws = try #require(object["jws"]?.stringValue)
        return (jws, Date(timeIntervalSince1970: 1_752_575_757))
    }

    @Test("a real Apple identity token creates a session and updates the account; a changed byte, a wrong nonce, an unlisted client ID or the wrong time are 401 with the receiver's reasons")
    func realIdentityToken() async throws {
        let (jws, iat) = try Self.identityToken()
        let h = try await Self.realTokenHarness(at: iat.addingTimeInterval(1))
        let token = try await API.token(h, [.sessionsWrite, .accountsRead])
        let created = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(jws)])
        #expect(created.status == 201, "\(created.body)")
        #expect(created.json?["aud"] == .string("com.example.app"))
        #expect(created.json?["sub"] == .string("000739.90ab72d5c78444a9bdf1a3fb80ff6660.2105"))
        let account = try await API.call(h, .GET, "/v1/accounts/com.example.app/000739.90ab72d5c78444a9bdf1a3fb80ff6660.2105", token: token)
        #expect(account.status == 200)
        #expect(account.json?["email"] == .string("ugs6qtpehf@privaterelay.appleid.com"))
        #expect(account.json?["is_private_email"] == .bool(true))
        #expect(account.json?["real_user_status"] == .number(0))

        func refused(_ body: JSONValue, _ reason: String, harness: Harness? = nil) async throws {
            let answer = try await API.call(harness ?? h, .POST, "/v1/sessions", token: token, body: body)
            #expect(answer.status == 401, "\(answer.body)")
            #expect(answer.json?["error"] == .string("invalid_token"))
            #expect(answer.json?["reason"] == .string(reason), "\(answer.body)")
        }
        // One byte of the signature changed (the middle of the segment: still canonical base64url).
        var bytes = Array(jws.utf8)
        let middle = bytes.count - 100
        bytes[middle] = bytes[middle] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        try await refused(["identity_token": .string(String(decoding: bytes, as: UTF8.self))], "bad_signature")
        try await refused(["identity_token": .string(jws), "nonce": "the-nonce-my-app-sent"], "nonce_mismatch")
        await h.stop()

        let unlisted = try await Self.realTokenHarness(at: iat.addingTimeInterval(1), clientIDs: "com.example.app")
        let token2 = try await API.token(unlisted, [.sessionsWrite])
        let answer = try await API.call(unlisted, .POST, "/v1/sessions", token: token2, body: ["identity_token": .string(jws)])
        #expect(answer.status == 401 && answer.json?["reason"] == .string("wrong_audience"))
        await unlisted.stop()

        let late = try await Self.realTokenHarness(at: Date())
        let token3 = try await API.token(late, [.sessionsWrite])
        let expired = try await API.call(late, .POST, "/v1/sessions", token: token3, body: ["identity_token": .string(jws)])
        #expect(expired.status == 401 && expired.json?["reason"] == .string("expired"))
        await late.stop()
    }

    @Test("a nonce is checked as Apple embeds it: the SHA-256 hex of the raw nonce; a token without exp is 401 missing_expiry")
    func nonce() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite])
        let raw = "n-\(UUID().uuidString)"
        let hashed = SHA256.hash(data: Data(raw.utf8)).map { String(format: "%02x", $0) }.joined()
        let identity = try h.signer.identityToken(aud: Harness.aud, sub: "001.nonce.1", nonce: hashed)
        #expect(try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(identity), "nonce": .string(raw)]).status == 201)
        let replayed = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(identity), "nonce": .string(hashed)])
        #expect(replayed.json?["reason"] == .string("nonce_mismatch"))
        // An identity token without exp: Apple's always carry one.
        let claims = JSONValue.object([
            "iss": .string(NotificationVerifier.appleIssuer), "aud": .string(Harness.aud), "sub": .string("001.noexp.1"),
            "iat": .number(Date().timeIntervalSince1970.rounded(.down)),
        ])
        let noExpiry = try h.signer.sign(header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]), claims: claims)
        let refused = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(noExpiry)])
        #expect(refused.status == 401 && refused.json?["reason"] == .string("missing_expiry"), "\(refused.body)")
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '001.noexp.1'") == 0)
        await h.stop()
    }

    @Test("no session for an Apple ID that Apple deleted: 409 conflict, reason account_deleted")
    func deletedAccount() async throws {
        let e = try await EffectHarness.start()
        try await e.post("account-delete", sub: "001.deleted.1", at: 1_000)
        try await e.drain()
        let token = try await API.token(e.h, [.sessionsWrite])
        let answer = try await API.call(e.h, .POST, "/v1/sessions", token: token, body: ["aud": "com.example.app", "sub": "001.deleted.1"])
        #expect(answer.status == 409)
        #expect(answer.json?["error"] == .string("conflict"))
        #expect(answer.json?["reason"] == .string("account_deleted"))
        #expect(try await e.h.count("SELECT count(*) FROM sessions WHERE sub = '001.deleted.1'") == 0)
        await e.stop()
    }

    @Test("after consent-revoked, a session needs an identity token issued after the revocation, which records consent given again; aud+sub alone or an older token is 409 consent_revoked")
    func consentRevokedStopsNewSessions() async throws {
        let e = try await EffectHarness.start()
        let sub = "001.consent.1"
        let revokedAt = Date().addingTimeInterval(-60).timeIntervalSince1970.rounded(.down)
        let revocation = try e.h.signer.notification(aud: Harness.aud, type: "consent-revoked", sub: sub, eventTime: Date(timeIntervalSince1970: revokedAt))
        #expect(try await e.h.server.post(jws: revocation).status == 200)
        try await e.drain()
        let token = try await API.token(e.h, [.sessionsWrite, .accountsRead])
        func create(_ body: JSONValue) async throws -> TestServer.Answer { try await API.call(e.h, .POST, "/v1/sessions", token: token, body: body) }

        let plain = try await create(["aud": .string(Harness.aud), "sub": .string(sub)])
        #expect(plain.status == 409 && plain.json?["error"] == .string("conflict") && plain.json?["reason"] == .string("consent_revoked"), "\(plain.body)")
        #expect(plain.json?["message"]?.stringValue?.contains("sign") == true)
        let older = try e.h.signer.identityToken(aud: Harness.aud, sub: sub, issuedAt: Date(timeIntervalSince1970: revokedAt - 30))
        let refused = try await create(["identity_token": .string(older)])
        #expect(refused.status == 409 && refused.json?["reason"] == .string("consent_revoked"), "\(refused.body)")
        #expect(try await e.h.count("SELECT count(*) FROM sessions WHERE sub = '\(sub)'") == 0)

        // The person signs in again: a token issued after the revocation opens a session…
        let signedInAt = Date(timeIntervalSince1970: revokedAt + 30)
        let newer = try e.h.signer.identityToken(aud: Harness.aud, sub: sub, issuedAt: signedInAt)
        #expect(try await create(["identity_token": .string(newer)]).status == 201)
        let account = try await API.call(e.h, .GET, "/v1/accounts/\(Harness.aud)/\(sub)", token: token)
        #expect(account.json?["consent_given_at"] == .string(iso8601(signedInAt)), "\(account.body)")
        #expect(account.json?["consent_revoked_at"] == .string(iso8601(Date(timeIntervalSince1970: revokedAt))))
        // …and consent given again lets the backend vouch for the user as before.
        #expect(try await create(["aud": .string(Harness.aud), "sub": .string(sub)]).status == 201)
        await e.stop()
    }

    @Test("a consent revocation being applied while a session is created: the session waits for it and is refused")
    func consentRevokedConcurrently() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite])
        let sub = "001.consent.race"
        #expect(try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": .string(Harness.aud), "sub": .string(sub)]).status == 201)
        let logger = Logger(label: "effect")
        let answer = try await h.server.client.withConnection { connection in
            // What the effect does, in its own transaction: the account row changed and held.
            try await connection.query("BEGIN", logger: logger)
            try await connection.query("UPDATE accounts SET consent_revoked_at = now() WHERE aud = \(Harness.aud) AND sub = \(sub)", logger: logger)
            let creating = Task { try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": .string(Harness.aud), "sub": .string(sub)]) }
            let waiting = try await DatabaseEvents.waitForLockWaiters(
                h.server.client, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", reach: 1)
            #expect(waiting, "the session's creation never waited for the account row")
            try await connection.query("COMMIT", logger: logger)
            return try await creating.value
        }
        #expect(answer.status == 409 && answer.json?["reason"] == .string("consent_revoked"), "\(answer.body)")
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '\(sub)'") == 1)
        await h.stop()
    }

    @Test("an account's sessions page by cursor; bad limit and cursor name the parameter")
    func accountSessions() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite, .sessionsRead])
        var ids: [String] = []
        for _ in 0..<3 {
            let created = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["aud": "com.example.app", "sub": "001.pages.1"])
            ids.append(try #require(created.json?["id"]?.stringValue))
        }
        let first = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1/sessions?limit=2", token: token)
        let firstItems = first.json?["items"]?.arrayValue ?? []
        #expect(firstItems.compactMap { $0["id"]?.stringValue } == [ids[2], ids[1]])
        let cursor = try #require(first.json?["next_cursor"]?.stringValue)
        let second = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1/sessions?limit=2&cursor=\(cursor)", token: token)
        let secondItems = second.json?["items"]?.arrayValue ?? []
        #expect(secondItems.compactMap { $0["id"]?.stringValue } == [ids[0]])
        #expect(second.json?["next_cursor"] == .null)
        let badLimit = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1/sessions?limit=0", token: token)
        #expect(badLimit.status == 400 && badLimit.json?["message"]?.stringValue?.hasPrefix("limit") == true)
        let badCursor = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1/sessions?cursor=zz", token: token)
        #expect(badCursor.status == 400 && badCursor.json?["message"]?.stringValue?.hasPrefix("cursor") == true)
        let accountReader = try await API.token(h, [.accountsRead])
        let account = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1", token: accountReader)
        #expect(account.status == 200 && account.json?["email"] == .null && account.json?["deleted_at"] == .null)
        let unknown = try await API.call(h, .GET, "/v1/accounts/com.example.app/001.nobody", token: accountReader)
        #expect(unknown.status == 404 && unknown.json?["error"] == .string("not_found"))
        #expect(try await API.call(h, .GET, "/v1/accounts/com.example.app/001.pages.1/sessions", token: accountReader).status == 403)
        await h.stop()
    }

    @Test("a privacy erasure: sessions revoked (erased), the address gone from every table but the suppression list, audited; an older email event does not bring it back")
    func erasure() async throws {
        let e = try await EffectHarness.start()
        let email = "erase-on-request-5k@privaterelay.appleid.com"
        try await e.post("email-disabled", sub: "001.erase.1", at: 1_000, email: email)
        try await e.drain()
        let token = try await API.token(e.h, [.sessionsWrite, .accountsRead, .accountsErase])
        _ = try await API.call(e.h, .POST, "/v1/sessions", token: token, body: ["aud": "com.example.app", "sub": "001.erase.1"])
        #expect(try await DatabaseSearch.occurrences(of: email, in: e.client) > 0)

        let reader = try await API.token(e.h, [.accountsRead])
        #expect(try await API.call(e.h, .DELETE, "/v1/accounts/com.example.app/001.erase.1", token: reader).status == 403)
        let erased = try await API.call(e.h, .DELETE, "/v1/accounts/com.example.app/001.erase.1", token: token)
        #expect(erased.status == 200)
        #expect(erased.json?["revoked_sessions"] == .number(1))
        // Kept in one place only, on purpose: the suppression list, as "do not mail" (issue 44).
        let suppressionList: Set<String> = ["suppressions", "suppression_changes"]
        #expect(try await DatabaseSearch.occurrences(of: email, in: e.client, except: suppressionList) == 0)
        #expect(try await e.h.count("SELECT count(*) FROM suppressions WHERE sub = '001.erase.1' AND suppressed AND reason = 'erased'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM sessions WHERE sub = '001.erase.1' AND revoked_reason = 'erased'") == 1)
        let account = try await API.call(e.h, .GET, "/v1/accounts/com.example.app/001.erase.1", token: token)
        #expect(account.json?["email"] == .null)
        #expect(account.json?["erased_at"]?.stringValue != nil)
        #expect(account.json?["email_forwarding"] == .string("disabled"))
        let audit = try await TokenStore(client: e.client, logger: e.h.logs.logger()).audit(limit: 10)
        #expect(audit.contains { $0.action == "account.erase" && $0.target == "com.example.app/001.erase.1" && $0.actor.hasPrefix("token:") })

        // Apple delivers an older email event late: its address is not stored, and it is redacted.
        try await e.post("email-enabled", sub: "001.erase.1", at: 500, email: email)
        try await e.drain()
        #expect(try await DatabaseSearch.occurrences(of: email, in: e.client, except: suppressionList) == 0)
        #expect(try await e.h.count("SELECT count(*) FROM suppressions WHERE sub = '001.erase.1' AND suppressed") == 1, "an older email-enabled lifted it")
        await e.stop()
    }

    @Test("db grant-backend: the role can run docs/integration.md's session SQL (refused after a consent revocation or deletion) and cannot read notifications or tokens")
    func grantBackend() async throws {
        let database = try await TestCluster.shared.makeDatabase()
        let h = try await Harness.start(database: database)
        let role = "backend_\(UUID().uuidString.prefix(8).lowercased())"
        try await h.server.client.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN"))
        let outcome = try await BackendGrants(client: h.server.client, logger: h.logs.logger()).grant(role: role)
        #expect(outcome.statements.count == 5)
        await #expect(throws: BackendGrantsError.self) { try await BackendGrants(client: h.server.client, logger: h.logs.logger()).grant(role: "no_such_role_x") }

        var configuration = database
        configuration.username = role
        let backend = PostgresClient(configuration: configuration)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await backend.run() }
            var id = ""
            for try await (created,) in try await backend.query(
                "INSERT INTO sessions (aud, sub, expires_at) VALUES ('com.example.app', '001.grant.1', now() + interval '30 days') RETURNING id::text"
            ).decode((String,).self) {
                id = created
            }
            var valid = 0
            for try await (one,) in try await backend.query(
                "SELECT 1 FROM sessions WHERE id = \(id)::uuid AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"
            ).decode((Int,).self) {
                valid = one
            }
            #expect(valid == 1)
            try await backend.query("UPDATE sessions SET revoked_at = now(), revoked_reason = 'logout' WHERE id = \(id)::uuid AND revoked_at IS NULL")
            _ = try await backend.query("SELECT email FROM accounts WHERE aud = 'com.example.app' AND sub = '001.grant.1'")
            for table in ["notifications", "api_tokens", "jobs", "audit_log", "rejections"] {
                await #expect(throws: PSQLError.self, "\(table)") {
                    try await backend.query(PostgresQuery(unsafeSQL: "SELECT count(*) FROM \(table)"))
                }
            }
            // The database holds the API's rules: after a consent revocation only an identity token
            // issued after it (the guide's SQL, identity_issued_at); never for a deleted Apple ID.
            try await h.server.client.query(
                "INSERT INTO accounts (aud, sub, consent_revoked_at) VALUES ('com.example.app', '001.grant.revoked', now() - interval '1 minute')")
            try await h.server.client.query("INSERT INTO accounts (aud, sub, deleted_at) VALUES ('com.example.app', '001.grant.deleted', now())")
            func refusal(_ sql: PostgresQuery) async -> String? {
                do {
                    try await backend.query(sql)
                    return nil
                } catch let error as PSQLError {
                    return error.serverInfo?[.sqlState]
                } catch {
                    return "\(error)"
                }
            }
            #expect(await refusal("INSERT INTO sessions (aud, sub, expires_at) VALUES ('com.example.app', '001.grant.revoked', now() + interval '1 day')") == "SE002")
            #expect(await refusal("INSERT INTO sessions (aud, sub, identity_issued_at) VALUES ('com.example.app', '001.grant.revoked', now() - interval '2 minutes')") == "SE002")
            #expect(await refusal("INSERT INTO sessions (aud, sub, identity_issued_at) VALUES ('com.example.app', '001.grant.revoked', now())") == nil)
            #expect(await refusal("INSERT INTO sessions (aud, sub, identity_issued_at) VALUES ('com.example.app', '001.grant.deleted', now())") == "SE001")
            #expect(try await h.count("SELECT count(*) FROM accounts WHERE sub = '001.grant.revoked' AND consent_given_at IS NOT NULL") == 1)
            // Only what creating a session needs: no choosing its revocation at insert time.
            await #expect(throws: PSQLError.self) {
                try await backend.query("INSERT INTO sessions (aud, sub, revoked_at, revoked_reason) VALUES ('a', 'b', now(), 'logout')")
            }
            // A revocation is final: the role may log a session out, never clear or rename a
            // revocation (the logged-out session above, and one revoked because Apple deleted the ID).
            #expect(await refusal("UPDATE sessions SET revoked_at = NULL, revoked_reason = NULL WHERE id = \(id)::uuid") == "SE003")
            try await h.server.client.query(
                "INSERT INTO sessions (aud, sub, revoked_at, revoked_reason, revoked_event_time) VALUES ('com.example.app', '001.grant.gone', now(), 'account-delete', now())")
            #expect(await refusal("UPDATE sessions SET revoked_at = NULL, revoked_reason = NULL WHERE sub = '001.grant.gone'") == "SE003")
            #expect(await refusal("UPDATE sessions SET revoked_reason = 'logout' WHERE sub = '001.grant.gone'") == "SE003")
            #expect(await refusal("UPDATE sessions SET revoked_at = now() - interval '1 day' WHERE sub = '001.grant.gone'") == "SE003")
            #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '001.grant.gone' AND revoked_reason = 'account-delete'") == 1)
            group.cancelAll()
        }
        await h.stop()
    }
}
