import Foundation
import NIOHTTP1
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Testing

/// App transfer as TN3159 describes it: the migration token at `/auth/token`, then
/// `/auth/usermigrationinfo` for the sending team (a transfer_sub) and the recipient (the user).
@Suite("The stand-in's migration token and /auth/usermigrationinfo", .timeLimit(.minutes(10)))
struct MigrationEndpointTests {
    static let target = "TEAMB00002"

    @Test("client_credentials with scope user.migration answers an hour's Bearer token; another scope is invalid_scope")
    func token() async throws {
        try await StandIn.run { standIn in
            let answer = try await standIn.migrationToken(standIn.secrets)
            #expect(answer.status == 200 && answer.headers.first(name: "content-type") == "application/json;charset=UTF-8", "\(answer.body)")
            let json = try #require(answer.json?.objectValue)
            #expect(Set(json.keys) == ["access_token", "token_type", "expires_in"])
            #expect(json["token_type"] == "Bearer" && json["expires_in"] == .number(3600) && json["access_token"]?.stringValue?.isEmpty == false)
            #expect(try await standIn.migrationToken(standIn.secrets, scope: "openid").appleError == .invalidScope)
            let noScope = try await standIn.post(
                "auth/token", form: [("grant_type", "client_credentials"), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret())])
            #expect(noScope.appleError == .invalidRequest)
            let badSecret = try await standIn.post(
                "auth/token", form: [("grant_type", "client_credentials"), ("scope", "user.migration"), ("client_id", StandIn.clientID), ("client_secret", "x.y.z")])
            #expect(badSecret.appleError == .invalidClient)
        }
    }

    @Test("the Bearer (scheme in any case): missing is invalid_client; unknown, expired (after 3600 s) or another team's is invalid_grant")
    func bearer() async throws {
        try await StandIn.run { standIn in
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: nil).appleError == .invalidClient)
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: "m00").appleError == .invalidGrant)
            // A secret minted at the stand-in's current time (the clock moves below).
            func form() throws -> [(String, String)] {
                [("sub", "001.a.1"), ("target", Self.target), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret())]
            }
            for header in ["Basic dXNlcjpwYXNz", "Bearer ", "Bearer"] {
                #expect(try await standIn.post("auth/usermigrationinfo", form: form(), authorization: header).appleError == .invalidClient, "\(header)")
            }
            let bearer = try await standIn.bearer(standIn.secrets)
            let recipientBearer = try await standIn.bearer(standIn.recipient)
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: recipientBearer).appleError == .invalidGrant)
            standIn.clock.advance(by: 3599)
            #expect(try await standIn.post("auth/usermigrationinfo", form: form(), authorization: "bearer \(bearer)").status == 200)
            standIn.clock.advance(by: 1)
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: bearer).appleError == .invalidGrant)
        }
    }

    @Test("a transfer_sub is stable for (sub, target) and differs per target and per user")
    func stable() async throws {
        try await StandIn.run { standIn in
            let bearer = try await standIn.bearer(standIn.secrets)
            func transferSub(_ sub: String, _ target: String) async throws -> String {
                let answer = try await standIn.transferSub(sub, target: target, bearer: bearer)
                #expect(answer.json?.objectValue?.keys.sorted() == ["transfer_sub"], "\(answer.status) \(answer.body)")
                return try #require(answer.json?["transfer_sub"]?.stringValue)
            }
            let first = try await transferSub("001234.abc.0001", Self.target)
            #expect(try await transferSub("001234.abc.0001", Self.target) == first)
            #expect(try await transferSub("001234.abc.0001", "TEAMC00003") != first)
            #expect(try await transferSub("001234.abc.0002", Self.target) != first)
            #expect(first.utf8.count <= AppleTransferSub.maximumLength && !first.contains("001234"))
        }
    }

    @Test("sender to recipient: the user's new sub is Apple-shaped and the same every time; a relay user gets a new address")
    func roundTrip() async throws {
        try await StandIn.run { standIn in
            let (sending, receiving) = (try await standIn.bearer(standIn.secrets), try await standIn.bearer(standIn.recipient))
            let plain = try #require(try await standIn.transferSub("001.plain.1", target: Self.target, bearer: sending).json?["transfer_sub"]?.stringValue)
            let answer = try await standIn.migratedUser(plain, bearer: receiving)
            #expect(answer.status == 200, "\(answer.body)")
            let user = try #require(AppleMigratedUser.parse(Array(answer.body.utf8)))
            #expect(user.email == nil && user.isPrivateEmail == nil && answer.json?.objectValue?.count == 1)
            #expect(user.sub.wholeMatch(of: /[0-9]{6}\.[0-9a-f]{32}\.[0-9]{4}/) != nil, "\(user.sub)")
            #expect(try await standIn.migratedUser(plain, bearer: receiving).body == answer.body)

            standIn.service.markUser(.init(sub: "001.relay.1", isPrivateEmail: true))
            let relay = try #require(try await standIn.transferSub("001.relay.1", target: Self.target, bearer: sending).json?["transfer_sub"]?.stringValue)
            let moved = try #require(AppleMigratedUser.parse(Array(try await standIn.migratedUser(relay, bearer: receiving).body.utf8)))
            #expect(moved.isPrivateEmail == true && moved.email?.hasSuffix("@privaterelay.appleid.com") == true && moved.sub != user.sub)
        }
    }

    @Test("invalid_request: a revoked user, the wrong recipient, the caller's own team, a malformed target or transfer_sub")
    func refusals() async throws {
        try await StandIn.run { standIn in
            let (sending, receiving) = (try await standIn.bearer(standIn.secrets), try await standIn.bearer(standIn.recipient))
            let transfer = try #require(try await standIn.transferSub("001.gone.1", target: Self.target, bearer: sending).json?["transfer_sub"]?.stringValue)
            // Asked by the sending team, not the target.
            #expect(try await standIn.migratedUser(transfer, as: standIn.secrets, bearer: sending).appleError == .invalidRequest)
            #expect(try await standIn.transferSub("001.a.1", target: standIn.secrets.teamID, bearer: sending).appleError == .invalidRequest)
            for target in ["TEAMB0000", "teamb00002", "TEAMB000022"] {
                #expect(try await standIn.transferSub("001.a.1", target: target, bearer: sending).appleError == .invalidRequest, "\(target)")
            }
            #expect(try await standIn.migratedUser("st1.AAAA", bearer: receiving).appleError == .invalidRequest)
            var tampered = Array(transfer)
            tampered[8] = tampered[8] == "A" ? "B" : "A"
            #expect(try await standIn.migratedUser(String(tampered), bearer: receiving).appleError == .invalidRequest)
            let both = try await standIn.post(
                "auth/usermigrationinfo",
                form: [("sub", "001.a.1"), ("target", Self.target), ("transfer_sub", transfer), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret())],
                authorization: "Bearer \(sending)")
            #expect(both.appleError == .invalidRequest)

            standIn.service.markUser(.init(sub: "001.gone.1", revoked: true))
            #expect(try await standIn.migratedUser(transfer, bearer: receiving).appleError == .invalidRequest)
            #expect(try await standIn.transferSub("001.gone.1", target: Self.target, bearer: sending).appleError == .invalidRequest)
        }
    }

    @Test("the rate limit answers 429 past migrationPerSecond, and admits again once the injected clock moves")
    func rateLimit() async throws {
        var limits = AuthLedger.Limits()
        limits.migrationPerSecond = 2
        try await StandIn.run(limits: limits) { standIn in
            let bearer = try await standIn.bearer(standIn.secrets)
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: bearer).status == 200)
            #expect(try await standIn.transferSub("001.a.2", target: Self.target, bearer: bearer).status == 200)
            #expect(try await standIn.transferSub("001.a.3", target: Self.target, bearer: bearer).status == 429)
            standIn.clock.advance(by: 0.5)
            #expect(try await standIn.transferSub("001.a.3", target: Self.target, bearer: bearer).status == 200)
            #expect(try await standIn.transferSub("001.a.4", target: Self.target, bearer: bearer).status == 429)
            standIn.clock.advance(by: 1)
            #expect(try await standIn.transferSub("001.a.4", target: Self.target, bearer: bearer).status == 200)
        }
    }

    @Test("the failure switch acts on usermigrationinfo")
    func failureSwitch() async throws {
        try await StandIn.run { standIn in
            let bearer = try await standIn.bearer(standIn.secrets)
            let set = try await standIn.post("standin/failures", body: #"{"endpoint":"usermigrationinfo","status":503}"#, contentType: "application/json")
            #expect(set.status == 204, "\(set.body)")
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: bearer).status == 503)
            #expect(try await standIn.transferSub("001.a.1", target: Self.target, bearer: bearer).status == 200)
        }
    }

    @Test("the same seed gives the same transfer_subs in another stand-in, which can open them; another seed gives others")
    func acrossInstances() async throws {
        func transferAndUser(seed: [UInt8]?, openingFirst: String? = nil) async throws -> (String, String?) {
            try await StandIn.run(transferSeed: seed) { standIn in
                let (sending, receiving) = (try await standIn.bearer(standIn.secrets), try await standIn.bearer(standIn.recipient))
                let transfer = try #require(try await standIn.transferSub("001.keep.1", target: Self.target, bearer: sending).json?["transfer_sub"]?.stringValue)
                let opened = try await openingFirst.asyncMap { try await standIn.migratedUser($0, bearer: receiving) }
                return (transfer, opened?.status == 200 ? opened?.json?["sub"]?.stringValue : nil)
            }
        }
        let (first, _) = try await transferAndUser(seed: nil)
        let (again, opened) = try await transferAndUser(seed: nil, openingFirst: first)
        #expect(again == first && opened != nil)
        let (seeded, foreign) = try await transferAndUser(seed: Array("another seed".utf8), openingFirst: first)
        #expect(seeded != first && foreign == nil)
    }

    @Test("/standin/users needs a sub and true/false marks")
    func usersRoute() async throws {
        try await StandIn.run { standIn in
            let good = try await standIn.post("standin/users", body: #"{"sub":"001.a.1","revoked":true}"#, contentType: "application/json")
            #expect(good.status == 200 && good.json == ["sub": "001.a.1", "is_private_email": .bool(false), "revoked": .bool(true)], "\(good.body)")
            let noSub = try await standIn.post("standin/users", body: #"{"revoked":true}"#, contentType: "application/json")
            #expect(noSub.status == 400 && noSub.json?["message"]?.stringValue?.contains("sub is required") == true)
            let badFlag = try await standIn.post("standin/users", body: #"{"sub":"s","is_private_email":"yes"}"#, contentType: "application/json")
            #expect(badFlag.status == 400 && badFlag.json?["message"]?.stringValue == "is_private_email must be true or false")
        }
    }
}

extension Optional {
    fileprivate func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        guard let self else { return nil }
        return try await transform(self)
    }
}
