import Foundation
import NIOHTTP1
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Testing

/// `POST /auth/token` as Apple answers it: code exchange, refresh, and each error word.
@Suite("The stand-in's /auth/token", .timeLimit(.minutes(10)))
struct TokenEndpointTests {
    @Test("A code exchange with a good ES256 secret answers Apple's JSON and an id_token the local JWKS verifies")
    func exchange() async throws {
        try await StandIn.run { standIn in
            let code = standIn.code(sub: "001.exchange.1", email: "x7k2q@privaterelay.appleid.com", isPrivateEmail: true,
                nonce: IdentityTokenVerifier.nonceHash("raw-nonce"))
            let answer = try await standIn.exchange(code)
            #expect(answer.status == 200, "\(answer.body)")
            #expect(answer.headers.first(name: "content-type") == "application/json;charset=UTF-8")
            let json = try #require(answer.json?.objectValue, "\(answer.body)")
            #expect(Set(json.keys) == ["access_token", "token_type", "expires_in", "refresh_token", "id_token"])
            #expect(json["token_type"] == "Bearer" && json["expires_in"] == .number(3600))
            #expect(json["access_token"]?.stringValue?.isEmpty == false && json["refresh_token"]?.stringValue?.isEmpty == false)

            let keys = try AppleKeySet.parse(StandIn.signer.jwksDocument())
            let idToken = try #require(json["id_token"]?.stringValue)
            let verified = try IdentityTokenVerifier(clientIDs: [StandIn.clientID]).verify(idToken, keys: keys, nonce: "raw-nonce", now: standIn.clock.now)
            #expect(verified.clientID == StandIn.clientID && verified.sub == "001.exchange.1")
            #expect(verified.email == "x7k2q@privaterelay.appleid.com" && verified.isPrivateEmail == true)
            #expect(verified.issuedAt == Int64(standIn.clock.now.timeIntervalSince1970))
            let claims = try #require(JSONValue.parse(CompactJWS(idToken).payload))
            #expect(claims["iss"] == "https://appleid.apple.com" && claims["email_verified"] == .bool(true))
            // Another client's verifier refuses it: the aud is the client ID the code was for.
            #expect(throws: VerificationError.self) {
                try IdentityTokenVerifier(clientIDs: [StandIn.otherClientID]).verify(idToken, keys: keys, nonce: nil, now: standIn.clock.now)
            }
        }
    }

    @Test("A code carries no email claims when issued without one")
    func noEmail() async throws {
        try await StandIn.run { standIn in
            let answer = try await standIn.exchange(standIn.code(sub: "001.noemail.1"))
            let idToken = try #require(answer.json?["id_token"]?.stringValue, "\(answer.body)")
            let claims = try #require(JSONValue.parse(CompactJWS(idToken).payload))
            #expect(claims["sub"] == "001.noemail.1")
            #expect(claims["email"] == nil && claims["email_verified"] == nil && claims["is_private_email"] == nil && claims["nonce"] == nil)
        }
    }

    @Test("A code used twice is invalid_grant the second time")
    func reusedCode() async throws {
        try await StandIn.run { standIn in
            let code = standIn.code()
            #expect(try await standIn.exchange(code).status == 200)
            let second = try await standIn.exchange(code)
            #expect(second.appleError == .invalidGrant, "\(second.status) \(second.headers) \(second.body)")
        }
    }

    @Test("A code lives 5 minutes: valid after 299 s, invalid_grant after 301 s (the injected clock)")
    func expiredCode() async throws {
        try await StandIn.run { standIn in
            let fresh = standIn.code(), stale = standIn.code()
            standIn.clock.advance(by: 299)
            #expect(try await standIn.exchange(fresh).status == 200)
            standIn.clock.advance(by: 2)
            let answer = try await standIn.exchange(stale)
            #expect(answer.appleError == .invalidGrant, "\(answer.status) \(answer.body)")
        }
    }

    @Test("A code is bound to its client and its redirect_uri")
    func codeBinding() async throws {
        try await StandIn.run { standIn async throws in
            // Another client of the team, with its own good secret: invalid_grant, and the code stays usable by its own client.
            let code = standIn.code()
            #expect(try await standIn.exchange(code, clientID: StandIn.otherClientID).appleError == .invalidGrant)
            #expect(try await standIn.exchange(code).status == 200)

            let web = standIn.code(redirectURI: "https://example.com/callback")
            #expect(try await standIn.exchange(web, redirectURI: "https://example.com/other").appleError == .invalidGrant)
            let again = standIn.code(redirectURI: "https://example.com/callback")
            #expect(try await standIn.exchange(again).appleError == .invalidGrant, "the redirect_uri is left out")
            let right = standIn.code(redirectURI: "https://example.com/callback")
            #expect(try await standIn.exchange(right, redirectURI: "https://example.com/callback").status == 200)
            let native = standIn.code()
            #expect(try await standIn.exchange(native, redirectURI: "https://example.com/callback").appleError == .invalidGrant)
        }
    }

    @Test("A refresh answers a new access token and an id_token, without a refresh_token")
    func refresh() async throws {
        try await StandIn.run { standIn in
            let exchanged = try await standIn.exchange(standIn.code(sub: "001.refresh.1"))
            let refreshToken = try #require(exchanged.json?["refresh_token"]?.stringValue)
            let answer = try await standIn.refresh(refreshToken)
            #expect(answer.status == 200, "\(answer.body)")
            let json = try #require(answer.json?.objectValue)
            #expect(Set(json.keys) == ["access_token", "token_type", "expires_in", "id_token"])
            #expect(json["access_token"] != exchanged.json?["access_token"])
            #expect(try await standIn.refresh("r-never-issued").appleError == .invalidGrant)
            #expect(try await standIn.refresh(refreshToken, clientID: StandIn.otherClientID).appleError == .invalidGrant)
        }
    }

    /// Bodies Apple refuses with invalid_request.
    enum BadBody: String, CaseIterable, CustomTestStringConvertible {
        case json, noContentType, badPercentEncoding, repeatedParameter, missingCode, missingSecret, missingGrantType, tooLarge
        var testDescription: String { rawValue }
    }

    @Test("A body that is not a complete form is invalid_request", arguments: BadBody.allCases)
    func badBody(_ bad: BadBody) async throws {
        try await StandIn.run(maximumBodySize: 4096) { standIn in
            let code = standIn.code()
            let good = [("grant_type", "authorization_code"), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret()), ("code", code)]
            let form = StandIn.encode(good)
            let answer: StandIn.Answer
            switch bad {
            case .json:
                let json = JSONValue.object(Dictionary(uniqueKeysWithValues: good.map { ($0, JSONValue.string($1)) })).jsonText
                answer = try await standIn.post("auth/token", body: json, contentType: "application/json")
            case .noContentType: answer = try await standIn.post("auth/token", body: form, contentType: nil)
            case .badPercentEncoding:
                answer = try await standIn.post("auth/token", body: form + "&state=%zz", contentType: "application/x-www-form-urlencoded")
            case .repeatedParameter: answer = try await standIn.post("auth/token", form: good + [("code", code)])
            case .missingCode: answer = try await standIn.post("auth/token", form: good.filter { $0.0 != "code" })
            case .missingSecret: answer = try await standIn.post("auth/token", form: good.filter { $0.0 != "client_secret" })
            case .missingGrantType: answer = try await standIn.post("auth/token", form: good.filter { $0.0 != "grant_type" })
            case .tooLarge: answer = try await standIn.post("auth/token", form: good + [("padding", String(repeating: "x", count: 5000))])
            }
            #expect(answer.appleError == .invalidRequest, "\(answer.status) \(answer.headers) \(answer.body)")
            // The same form, well-formed, exchanges the code: the refusal was the body's.
            #expect(try await standIn.post("auth/token", form: good).status == 200)
        }
    }

    @Test("A form with charset in its content type is a form")
    func formWithCharset() async throws {
        try await StandIn.run { standIn in
            let form = StandIn.encode([
                ("grant_type", "authorization_code"), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret()), ("code", standIn.code()),
            ])
            let answer = try await standIn.post("auth/token", body: form, contentType: "application/x-www-form-urlencoded; charset=UTF-8")
            #expect(answer.status == 200, "\(answer.body)")
        }
    }

    @Test("An unknown grant type is unsupported_grant_type", arguments: ["password", "urn:ietf:params:oauth:grant-type:jwt-bearer", "AUTHORIZATION_CODE"])
    func unknownGrant(_ grantType: String) async throws {
        try await StandIn.run { standIn in
            let answer = try await standIn.post(
                "auth/token",
                form: [("grant_type", grantType), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret()), ("code", standIn.code())])
            #expect(answer.appleError == .unsupportedGrantType, "\(answer.status) \(answer.body)")
        }
    }

    @Test("Codes beyond the table's bound push out the oldest")
    func boundedCodes() async throws {
        var limits = AuthLedger.Limits()
        limits.maximumEntries = 2
        try await StandIn.run(limits: limits) { standIn async throws in
            let (first, second, third) = (standIn.code(), standIn.code(), standIn.code())
            #expect(try await standIn.exchange(first).appleError == .invalidGrant)
            #expect(try await standIn.exchange(second).status == 200)
            #expect(try await standIn.exchange(third).status == 200)
        }
    }

    @Test("POST /standin/codes issues a code from JSON, and names what is wrong")
    func codesEndpoint() async throws {
        try await StandIn.run { standIn in
            let json = try await standIn.post(
                "standin/codes", body: #"{"client_id":"com.example.app","sub":"001.http.1","email":"a@example.com","is_private_email":false}"#,
                contentType: "application/json")
            let fromJSON = try #require(json.json?["code"]?.stringValue, "\(json.body)")
            let exchanged = try await standIn.exchange(fromJSON)
            let idToken = try #require(exchanged.json?["id_token"]?.stringValue, "\(exchanged.body)")
            let claims = try #require(JSONValue.parse(CompactJWS(idToken).payload))
            #expect(claims["email"] == "a@example.com" && claims["is_private_email"] == .bool(false))

            let web = try await standIn.post(
                "standin/codes", body: #"{"client_id":"com.example.web","sub":"001.http.2","redirect_uri":"https://example.com/cb"}"#,
                contentType: "application/json")
            let fromWeb = try #require(web.json?["code"]?.stringValue, "\(web.body)")
            #expect(try await standIn.exchange(fromWeb, clientID: StandIn.otherClientID, redirectURI: "https://example.com/cb").status == 200)

            let unknown = try await standIn.post("standin/codes", body: #"{"client_id":"com.example.nope","sub":"1"}"#, contentType: "application/json")
            #expect(unknown.status == 400 && unknown.json?["message"]?.stringValue?.contains("client_id") == true, "\(unknown.body)")
            let noSub = try await standIn.post("standin/codes", body: #"{"client_id":"com.example.app"}"#, contentType: "application/json")
            #expect(noSub.status == 400 && noSub.json?["message"]?.stringValue?.contains("sub") == true, "\(noSub.body)")
        }
    }
}
