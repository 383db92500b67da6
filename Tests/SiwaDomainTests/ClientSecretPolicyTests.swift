import Foundation
import SiwaDomain
import Testing

@Suite("Client secrets: Apple's claims and when to renew", .timeLimit(.minutes(10)))
struct ClientSecretPolicyTests {
    let now = Date(timeIntervalSince1970: 1_790_000_000.75)

    @Test("claims: iss the team, sub the client, aud Apple, iat backdated 60 s, exp an hour after iat")
    func claims() throws {
        let policy = try ClientSecretPolicy(teamID: "ABCDE12345")
        let claims = policy.claims(clientID: "com.example.app", now: now)
        #expect(claims.issuedAt == 1_790_000_000 - 60)
        #expect(claims.expiresAt == claims.issuedAt + 3600)
        #expect(claims.json == [
            "iss": "ABCDE12345", "sub": "com.example.app", "aud": "https://appleid.apple.com",
            "iat": .number(1_789_999_940), "exp": .number(1_790_003_540),
        ])
        #expect(claims.json.jsonText == #"{"aud":"https://appleid.apple.com","exp":1790003540,"iat":1789999940,"iss":"ABCDE12345","sub":"com.example.app"}"#)
        #expect(ClientSecretPolicy.header(keyID: "KEY1234567").jsonText == #"{"alg":"ES256","kid":"KEY1234567"}"#)
    }

    @Test("Apple's six-month limit holds: exactly 15,777,000 s is accepted, one second more refused")
    func lifetimeBound() throws {
        let longest = try ClientSecretPolicy(teamID: "ABCDE12345", lifetime: .seconds(15_777_000))
        let claims = longest.claims(clientID: "com.example.app", now: now)
        #expect(claims.expiresAt - claims.issuedAt == 15_777_000)
        #expect {
            try ClientSecretPolicy(teamID: "ABCDE12345", lifetime: .seconds(15_777_001))
        } throws: { "\($0)".contains("1 s to 15777000 s") && "\($0)".contains("got 15777001 s") }
        #expect(throws: ClientSecretPolicy.Invalid.self) { try ClientSecretPolicy(teamID: "ABCDE12345", lifetime: .zero) }
    }

    @Test("a secret is reused until the margin before exp, then renewed; and renewed if the clock goes back past iat")
    func renewal() throws {
        let policy = try ClientSecretPolicy(teamID: "ABCDE12345", lifetime: .seconds(3600), backdate: .seconds(60), renewalMargin: .seconds(300))
        let claims = policy.claims(clientID: "com.example.app", now: now)
        let renewAt = claims.expiresAt - 300
        #expect(!policy.needsRenewal(claims, now: now))
        #expect(!policy.needsRenewal(claims, now: Date(timeIntervalSince1970: Double(renewAt) - 0.5)))
        #expect(policy.needsRenewal(claims, now: Date(timeIntervalSince1970: Double(renewAt))))
        #expect(policy.needsRenewal(claims, now: Date(timeIntervalSince1970: Double(claims.expiresAt + 1))))
        #expect(!policy.needsRenewal(claims, now: Date(timeIntervalSince1970: Double(claims.issuedAt))))
        #expect(policy.needsRenewal(claims, now: Date(timeIntervalSince1970: Double(claims.issuedAt) - 1)))
    }

    @Test("settings that would mint a secret born expired or dated in the future are refused", arguments: [
        (Duration.seconds(3600), Duration.seconds(-1), Duration.seconds(300), "backdate"),
        (.seconds(3600), .seconds(3600), .seconds(0), "backdate"),
        (.seconds(3600), .seconds(60), .seconds(3540), "renewal margin"),
        (.seconds(3600), .seconds(60), .seconds(-1), "renewal margin"),
    ])
    func invalidTimes(lifetime: Duration, backdate: Duration, margin: Duration, word: String) {
        #expect {
            try ClientSecretPolicy(teamID: "ABCDE12345", lifetime: lifetime, backdate: backdate, renewalMargin: margin)
        } throws: { "\($0)".contains(word) }
    }

    @Test("team IDs are Apple's 10 characters, A-Z and 0-9", arguments: ["", "ABCDE1234", "ABCDE123456", "abcde12345", " ABCDE1234", "ABCDE-1234"])
    func teamID(teamID: String) {
        #expect { try ClientSecretPolicy(teamID: teamID) } throws: { "\($0)".contains("team ID must be 10 characters") }
    }
}
