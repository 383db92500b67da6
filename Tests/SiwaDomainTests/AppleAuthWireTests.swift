import Foundation
import SiwaDomain
import Testing

@Suite("Apple's auth endpoints: error words, form bodies, token answers, records", .timeLimit(.minutes(10)))
struct AppleAuthWireTests {
    @Test("each of Apple's six words in a 400 is its case; error_description is ignored", arguments: [
        ("invalid_request", AppleAuthError.invalidRequest), ("invalid_client", .invalidClient), ("invalid_grant", .invalidGrant),
        ("unauthorized_client", .unauthorizedClient), ("unsupported_grant_type", .unsupportedGrantType), ("invalid_scope", .invalidScope),
    ])
    func words(word: String, expected: AppleAuthError) {
        #expect(AppleAuthError(status: 400, body: Array(#"{"error":"\#(word)"}"#.utf8)) == expected)
        #expect(AppleAuthError(status: 400, body: Array(#"{"error_description":"invalid_scope","error":"\#(word)"}"#.utf8)) == expected)
        #expect(expected.word == word)
        #expect(AppleAuthError(word: word) == expected)
    }

    @Test("anything else is unrecognised with its status: a 5xx, an unknown word, no JSON, a word on a 2xx or 5xx")
    func unrecognised() {
        #expect(AppleAuthError(status: 500, body: Array("".utf8)) == .unrecognised(status: 500))
        #expect(AppleAuthError(status: 500, body: Array(#"{"error":"invalid_grant"}"#.utf8)) == .unrecognised(status: 500))
        #expect(AppleAuthError(status: 400, body: Array(#"{"error":"invalid_token"}"#.utf8)) == .unrecognised(status: 400))
        #expect(AppleAuthError(status: 400, body: Array(#"{"error":["invalid_grant"]}"#.utf8)) == .unrecognised(status: 400))
        #expect(AppleAuthError(status: 400, body: Array("<html>Bad Request</html>".utf8)) == .unrecognised(status: 400))
        #expect(AppleAuthError(status: 302, body: Array(#"{"error":"invalid_grant"}"#.utf8)) == .unrecognised(status: 302))
        #expect(AppleAuthError(status: 401, body: Array(#"{"error":"invalid_client"}"#.utf8)) == .invalidClient)
        #expect(AppleAuthError(word: "Invalid_Grant") == nil)
        #expect(AppleAuthError.unrecognised(status: 503).word == nil)
    }

    @Test("form bodies percent-encode every reserved character, so + / = & in a value arrive intact")
    func formEncoding() throws {
        let fields = [(name: "token", value: "a+b/c=d&e f.g-h_i~j%k"), (name: "redirect_uri", value: "https://example.com/cb?x=1"), (name: "é", value: "ü")]
        let body = FormURLEncoding.encode(fields)
        #expect(body == "token=a%2Bb%2Fc%3Dd%26e%20f.g-h_i~j%25k&redirect_uri=https%3A%2F%2Fexample.com%2Fcb%3Fx%3D1&%C3%A9=%C3%BC")
        let decoded = try #require(FormURLEncoding.decode(body))
        #expect(decoded.map(\.name) == fields.map(\.name) && decoded.map(\.value) == fields.map(\.value))
        #expect(FormURLEncoding.decode("a=b+c")?.first?.value == "b c")
        #expect(FormURLEncoding.decode("a=%2") == nil && FormURLEncoding.decode("a=%zz") == nil && FormURLEncoding.decode("a=%FF") == nil)
    }

    @Test("each call sends exactly Apple's fields; redirect_uri only when given")
    func fields() {
        func names(_ request: AppleAuthRequest) -> [String] { request.fields(clientID: "c", clientSecret: "s").map(\.name) }
        #expect(names(.exchange(code: "x", redirectURI: nil)) == ["client_id", "client_secret", "code", "grant_type"])
        #expect(names(.exchange(code: "x", redirectURI: "https://e.com/cb")) == ["client_id", "client_secret", "code", "grant_type", "redirect_uri"])
        #expect(names(.refresh(refreshToken: "r")) == ["client_id", "client_secret", "grant_type", "refresh_token"])
        #expect(names(.revoke(token: "r", hint: .refreshToken)) == ["client_id", "client_secret", "token", "token_type_hint"])
        #expect(AppleAuthRequest.exchange(code: "x", redirectURI: nil).fields(clientID: "c", clientSecret: "s")[3].value == "authorization_code")
        #expect(AppleAuthRequest.refresh(refreshToken: "r").fields(clientID: "c", clientSecret: "s")[2].value == "refresh_token")
        #expect(AppleAuthRequest.revoke(token: "r", hint: .accessToken).fields(clientID: "c", clientSecret: "s")[3].value == "access_token")
        #expect(AppleAuthRequest.exchange(code: "x", redirectURI: nil).endpoint == .token && AppleAuthRequest.revoke(token: "r", hint: .refreshToken).endpoint == .revoke)
    }

    @Test("the record of a call names endpoint, client, grant or hint and a fingerprint; it never holds the token")
    func record() {
        let token = "r0a1b2.c3d4-e5_f6.secret-refresh-token"
        let revoke = AppleAuthRequest.revoke(token: token, hint: .refreshToken).record(clientID: "com.example.app")
        #expect(revoke.endpoint == .revoke && revoke.clientID == "com.example.app" && revoke.tokenTypeHint == .refreshToken && revoke.grantType == nil)
        #expect(revoke.tokenFingerprint == AppleAuthRecord.fingerprint(token))
        #expect(revoke.tokenFingerprint.count == 12 && revoke.tokenFingerprint.allSatisfy(\.isHexDigit))
        #expect(revoke.tokenFingerprint != AppleAuthRecord.fingerprint(token + "x"))
        // SHA-256("abc") begins ba7816bf8f01.
        #expect(AppleAuthRecord.fingerprint("abc") == "ba7816bf8f01")
        let exchange = AppleAuthRequest.exchange(code: "c0de", redirectURI: nil).record(clientID: "com.example.app")
        #expect(exchange.endpoint == .token && exchange.grantType == .authorizationCode && exchange.tokenTypeHint == nil)
        for shown in [
            "\(revoke)", String(reflecting: revoke), "\(AppleAuthRequest.revoke(token: token, hint: .refreshToken))",
            String(reflecting: AppleAuthRequest.revoke(token: token, hint: .refreshToken)), dumped(AppleAuthRequest.refresh(refreshToken: token)),
        ] {
            #expect(!shown.contains("secret-refresh-token"), "\(shown)")
        }
        #expect("\(revoke)".contains("token=sha256:\(revoke.tokenFingerprint)"))
    }

    @Test("a token answer parses with or without refresh_token and id_token; printing it shows no token")
    func grant() throws {
        let full = try #require(AppleTokenGrant.parse(Array(
            #"{"access_token":"a.b.c","token_type":"Bearer","expires_in":3600,"refresh_token":"r.0.secret","id_token":"h.p.s"}"#.utf8)))
        #expect(full == AppleTokenGrant(accessToken: "a.b.c", tokenType: "Bearer", expiresIn: 3600, refreshToken: "r.0.secret", idToken: "h.p.s"))
        let refreshed = try #require(AppleTokenGrant.parse(Array(#"{"access_token":"a.b.c","token_type":"Bearer","expires_in":3600}"#.utf8)))
        #expect(refreshed.refreshToken == nil && refreshed.idToken == nil)
        for body in [
            "", "{}", #"{"token_type":"Bearer","expires_in":3600}"#, #"{"access_token":"a","token_type":"Bearer","expires_in":"3600"}"#,
            #"{"access_token":"a","token_type":"Bearer","expires_in":1.5}"#, #"{"access_token":"","token_type":"Bearer","expires_in":1}"#,
        ] {
            #expect(AppleTokenGrant.parse(Array(body.utf8)) == nil, "\(body)")
        }
        for shown in ["\(full)", String(reflecting: full), dumped(full)] {
            #expect(!shown.contains("secret") && !shown.contains("a.b.c") && !shown.contains("h.p.s"), "\(shown)")
        }
    }

    @Test("the migration calls send TN3159's fields in its order, to their endpoints")
    func migrationFields() {
        func sent(_ request: AppleAuthRequest) -> [String] { request.fields(clientID: "c", clientSecret: "s").map { "\($0.name)=\($0.value)" } }
        #expect(sent(.migrationToken) == ["grant_type=client_credentials", "scope=user.migration", "client_id=c", "client_secret=s"])
        #expect(sent(.transferSub(sub: "001.a.1", target: "TEAMB23456")) == ["sub=001.a.1", "target=TEAMB23456", "client_id=c", "client_secret=s"])
        #expect(sent(.migratedUser(transferSub: "t.x")) == ["transfer_sub=t.x", "client_id=c", "client_secret=s"])
        #expect(AppleAuthRequest.migrationToken.endpoint == .token && AppleAuthRequest.migrationToken.grantType == .clientCredentials)
        #expect(AppleAuthRequest.transferSub(sub: "s", target: "T").endpoint == .userMigrationInfo)
        #expect(AppleAuthRequest.migratedUser(transferSub: "t").endpoint == .userMigrationInfo)
        #expect(AppleAuthEndpoint.userMigrationInfo.rawValue == "/auth/usermigrationinfo")
    }

    @Test("a migration call's record fingerprints the sub or transfer_sub, names scope and target, and shows neither identifier")
    func migrationRecords() {
        let token = AppleAuthRequest.migrationToken.record(clientID: "com.example.app")
        #expect(token.endpoint == .token && token.grantType == .clientCredentials && token.scope == .userMigration && token.target == nil)
        #expect(token.tokenFingerprint == "e3b0c44298fc")  // SHA-256 of "": the call sends no code or token
        #expect("\(token)" == "/auth/token client_id=com.example.app grant_type=client_credentials scope=user.migration status=none")

        let sender = AppleAuthRequest.transferSub(sub: "001234.secretsub.0001", target: "TEAMB23456").record(clientID: "com.example.app")
        #expect(sender.endpoint == .userMigrationInfo && sender.grantType == nil && sender.target == "TEAMB23456")
        #expect(sender.tokenFingerprint == AppleAuthRecord.fingerprint("001234.secretsub.0001"))
        #expect("\(sender)" == "/auth/usermigrationinfo client_id=com.example.app target=TEAMB23456 sub=sha256:\(sender.tokenFingerprint) status=none")

        let recipient = AppleAuthRequest.migratedUser(transferSub: "000111.secrettransfer.9").record(clientID: "com.example.app")
        #expect(recipient.target == nil && recipient.tokenFingerprint == AppleAuthRecord.fingerprint("000111.secrettransfer.9"))
        #expect("\(recipient)".contains(" transfer_sub=sha256:\(recipient.tokenFingerprint) "))
        for shown in [
            "\(sender)", "\(recipient)", "\(AppleAuthRequest.transferSub(sub: "001234.secretsub.0001", target: "TEAMB23456"))",
            dumped(AppleAuthRequest.migratedUser(transferSub: "000111.secrettransfer.9")),
        ] {
            #expect(!shown.contains("secret"), "\(shown)")
        }
    }

    @Test("the migration token parses; printing it shows no token; it is usable until expires_in minus the margin")
    func migrationToken() throws {
        let token = try #require(AppleMigrationToken.parse(Array(#"{"access_token":"a.secret","token_type":"Bearer","expires_in":3600}"#.utf8)))
        #expect(token == AppleMigrationToken(accessToken: "a.secret", expiresIn: 3600))
        for body in ["{}", #"{"access_token":"","expires_in":3600}"#, #"{"access_token":"a","expires_in":"3600"}"#, #"{"access_token":"a"}"#] {
            #expect(AppleMigrationToken.parse(Array(body.utf8)) == nil, "\(body)")
        }
        for shown in ["\(token)", String(reflecting: token), dumped(token)] { #expect(!shown.contains("secret"), "\(shown)") }
        let issued = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(token.isUsable(issuedAt: issued, now: issued, margin: 300))
        #expect(token.isUsable(issuedAt: issued, now: issued.addingTimeInterval(3299), margin: 300))
        #expect(!token.isUsable(issuedAt: issued, now: issued.addingTimeInterval(3300), margin: 300))
        #expect(!token.isUsable(issuedAt: issued, now: issued.addingTimeInterval(-1), margin: 300))  // a clock set back: fetch anew
    }

    @Test("transfer_sub and migrated-user answers parse; a user prints without sub or email")
    func migrationAnswers() throws {
        #expect(AppleTransferSub.parse(Array(#"{"transfer_sub":"000111.abc.2222"}"#.utf8)) == "000111.abc.2222")
        for body in ["{}", #"{"transfer_sub":""}"#, #"{"transfer_sub":7}"#, #"{"transfer_sub":"\#(String(repeating: "x", count: 257))"}"#] {
            #expect(AppleTransferSub.parse(Array(body.utf8)) == nil, "\(body)")
        }
        let relay = try #require(AppleMigratedUser.parse(Array(
            #"{"sub":"001234.newsub.0001","email":"k3j4@privaterelay.appleid.com","is_private_email":true}"#.utf8)))
        #expect(relay == AppleMigratedUser(sub: "001234.newsub.0001", email: "k3j4@privaterelay.appleid.com", isPrivateEmail: true))
        #expect(AppleMigratedUser.parse(Array(#"{"sub":"s","is_private_email":"false"}"#.utf8)) == AppleMigratedUser(sub: "s", isPrivateEmail: false))
        #expect(AppleMigratedUser.parse(Array(#"{"sub":"s","email":7}"#.utf8)) == AppleMigratedUser(sub: "s"))
        #expect(AppleMigratedUser.parse(Array(#"{"email":"a@b.c"}"#.utf8)) == nil && AppleMigratedUser.parse(Array(#"{"sub":""}"#.utf8)) == nil)
        for shown in ["\(relay)", String(reflecting: relay), dumped(relay)] {
            #expect(!shown.contains("privaterelay") && !shown.contains("newsub"), "\(shown)")
        }
    }

    private func dumped(_ value: Any) -> String {
        var text = ""
        dump(value, to: &text)
        return text
    }
}
