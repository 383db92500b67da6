import Foundation
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Testing

/// `POST /auth/revoke`: 200 with no body for any token, as Apple; what was sent is recorded.
@Suite("The stand-in's /auth/revoke", .timeLimit(.minutes(10)))
struct RevokeEndpointTests {
    @Test("Revoke answers 200 with no body for a token it never issued, and records what was sent")
    func garbage() async throws {
        try await StandIn.run { standIn in
            let answer = try await standIn.revoke("garbage-token", hint: "access_token")
            #expect(answer.status == 200 && answer.body.isEmpty, "\(answer.status) \(answer.body)")
            let records = standIn.service.revocations
            #expect(records == [
                RevocationRecord(
                    clientID: StandIn.clientID, tokenTypeHint: "access_token", token: "garbage-token", receivedAt: standIn.clock.now, status: 200,
                    outcome: .unknownToken)
            ])
            // The same, for the CLI and other processes.
            let listed = try await standIn.get("standin/revocations")
            let first = try #require(listed.json?["revocations"]?.arrayValue?.first, "\(listed.body)")
            #expect(first["token"] == "garbage-token" && first["token_type_hint"] == "access_token" && first["client_id"] == "com.example.app")
            #expect(first["outcome"] == "unknown_token" && first["status"] == .number(200))
        }
    }

    @Test("A revoked grant's refresh token is then invalid_grant", arguments: ["refresh_token", "access_token"])
    func revokedRefreshToken(_ which: String) async throws {
        try await StandIn.run { standIn in
            let exchanged = try await standIn.exchange(standIn.code(sub: "001.revoke.1"))
            let refreshToken = try #require(exchanged.json?["refresh_token"]?.stringValue, "\(exchanged.body)")
            let token = try #require(exchanged.json?[which]?.stringValue)
            #expect(try await standIn.refresh(refreshToken).status == 200)

            // Another client of the team cannot revoke it: 200 all the same, nothing revoked.
            #expect(try await standIn.revoke(token, hint: which, clientID: StandIn.otherClientID).status == 200)
            #expect(try await standIn.refresh(refreshToken).status == 200)

            let answer = try await standIn.revoke(token, hint: which)
            #expect(answer.status == 200 && answer.body.isEmpty)
            let refreshed = try await standIn.refresh(refreshToken)
            #expect(refreshed.appleError == .invalidGrant, "\(refreshed.status) \(refreshed.body)")
            #expect(try await standIn.revoke(token, hint: which).status == 200)
            #expect(standIn.service.revocations.map(\.outcome) == [.otherClient, .revoked, .alreadyRevoked])
        }
    }

    @Test("Revoke refuses what Apple refuses: missing token, an unknown hint, a bad secret; each is recorded")
    func refusals() async throws {
        try await StandIn.run { standIn in
            let exchanged = try await standIn.exchange(standIn.code())
            let refreshToken = try #require(exchanged.json?["refresh_token"]?.stringValue)
            let missing = try await standIn.post("auth/revoke", form: [("client_id", StandIn.clientID), ("client_secret", try standIn.secret())])
            #expect(missing.appleError == .invalidRequest, "\(missing.body)")
            #expect(try await standIn.revoke(refreshToken, hint: "id_token").appleError == .invalidRequest)
            let bad = try standIn.secrets.secret(clientID: StandIn.clientID, issuedAt: standIn.clock.now.addingTimeInterval(3600))
            #expect(try await standIn.revoke(refreshToken, secret: bad).appleError == .invalidClient)
            let json = try await standIn.post("auth/revoke", body: #"{"token":"x"}"#, contentType: "application/json")
            #expect(json.appleError == .invalidRequest)
            #expect(try await standIn.refresh(refreshToken).status == 200, "nothing was revoked")
            #expect(standIn.service.revocations.map(\.outcome) == [.refused(.invalidRequest), .refused(.invalidRequest), .refused(.invalidClient), .refused(.invalidRequest)])
            #expect(standIn.service.revocations.map(\.token) == [nil, refreshToken, refreshToken, nil])
        }
    }

    @Test("The failure switch answers the next N requests with its status, then Apple's answers resume")
    func failureSwitch() async throws {
        try await StandIn.run { standIn in
            let exchanged = try await standIn.exchange(standIn.code())
            let refreshToken = try #require(exchanged.json?["refresh_token"]?.stringValue)
            standIn.service.failNext(2, of: .revoke, status: 503)
            #expect(try await standIn.revoke(refreshToken).status == 503)
            #expect(try await standIn.revoke(refreshToken).status == 503)
            #expect(try await standIn.refresh(refreshToken).status == 200, "the switch held the revocation back")
            #expect(try await standIn.revoke(refreshToken).status == 200)
            #expect(standIn.service.revocations.map(\.outcome) == [.injectedFailure(status: 503), .injectedFailure(status: 503), .revoked])
            #expect(standIn.service.revocations.map(\.token) == [refreshToken, refreshToken, refreshToken])

            // Through HTTP, on the token endpoint.
            let set = try await standIn.post("standin/failures", body: #"{"endpoint":"token","status":500,"count":1}"#, contentType: "application/json")
            #expect(set.status == 204, "\(set.body)")
            let code = standIn.code()
            #expect(try await standIn.exchange(code).status == 500)
            #expect(try await standIn.exchange(code).status == 200, "a switched answer does not use the code")
            let wrong = try await standIn.post("standin/failures", body: #"{"endpoint":"tokens","status":500}"#, contentType: "application/json")
            #expect(wrong.status == 400 && wrong.json?["message"]?.stringValue?.contains("token, revoke") == true, "\(wrong.body)")
        }
    }

    @Test("Only the newest revocation records are kept")
    func boundedRecords() async throws {
        var limits = AuthLedger.Limits()
        limits.maximumRevocations = 3
        try await StandIn.run(limits: limits) { standIn async throws in
            for index in 1...5 { #expect(try await standIn.revoke("token-\(index)").status == 200) }
            #expect(standIn.service.revocations.map(\.token) == ["token-3", "token-4", "token-5"])
        }
    }
}
