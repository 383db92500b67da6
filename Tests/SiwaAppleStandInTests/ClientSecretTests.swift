import Crypto
import Foundation
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Testing

/// Client secrets checked as Apple checks them: every bad one is `invalid_client` on the wire, and
/// refused for its own reason (so a test cannot pass because of another fault).
@Suite("The stand-in's client-secret checks", .timeLimit(.minutes(10)))
struct ClientSecretTests {
    enum BadSecret: String, CaseIterable, CustomTestStringConvertible {
        case forAnotherClient, unknownKeyID, signedByAnotherKey, issuedInFuture, expired, livesTooLong, derSignature
        case wrongAlgorithm, wrongAudience, wrongIssuer, notAJWT, unknownClientID
        var testDescription: String { rawValue }

        var reason: ClientSecretRejection {
            switch self {
            case .forAnotherClient: .wrongSubject
            case .unknownKeyID: .unknownKey
            case .signedByAnotherKey, .derSignature: .badSignature
            case .issuedInFuture: .issuedInFuture
            case .expired: .expired
            case .livesTooLong: .lifetimeTooLong
            case .wrongAlgorithm: .wrongAlgorithm
            case .wrongAudience: .wrongAudience
            case .wrongIssuer: .wrongIssuer
            case .notAJWT: .malformed
            case .unknownClientID: .unknownClient
            }
        }

        /// The secret, and the client ID the request names.
        func make(_ standIn: StandIn) throws -> (secret: String, clientID: String) {
            let secrets = standIn.secrets, now = standIn.clock.now, client = StandIn.clientID
            let minuteAgo = now.addingTimeInterval(-60)
            switch self {
            case .forAnotherClient: return (try secrets.secret(clientID: StandIn.otherClientID, issuedAt: minuteAgo), client)
            case .unknownKeyID: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, keyID: "KEY0000002"), client)
            case .signedByAnotherKey:
                return (try TestClientSecrets(teamID: secrets.teamID, keyID: secrets.keyID).secret(clientID: client, issuedAt: minuteAgo), client)
            case .issuedInFuture: return (try secrets.secret(clientID: client, issuedAt: now.addingTimeInterval(60)), client)
            case .expired: return (try secrets.secret(clientID: client, issuedAt: now.addingTimeInterval(-7200), lifetime: 3600), client)
            case .livesTooLong: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, lifetime: 15_777_001), client)
            case .derSignature: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, der: true), client)
            case .wrongAlgorithm: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, algorithm: "ES384"), client)
            case .wrongAudience: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, audience: "https://appleid.apple.com/"), client)
            case .wrongIssuer: return (try secrets.secret(clientID: client, issuedAt: minuteAgo, issuer: "TEAM000002"), client)
            case .notAJWT: return ("not-a-jwt", client)
            case .unknownClientID: return (try secrets.secret(clientID: "com.example.nope", issuedAt: minuteAgo), "com.example.nope")
            }
        }
    }

    @Test("A bad client secret is invalid_client, for its own reason, and leaves the code usable", arguments: BadSecret.allCases)
    func badSecret(_ bad: BadSecret) async throws {
        try await StandIn.run { standIn in
            let (secret, clientID) = try bad.make(standIn)
            let check = ClientSecretCheck(teams: [StandIn.team(standIn.secrets)])
            #expect(throws: bad.reason) { try check.check(secret, clientID: clientID, now: standIn.clock.now) }

            let code = standIn.code()
            let answer = try await standIn.exchange(code, secret: secret, clientID: clientID)
            #expect(answer.appleError == .invalidClient, "\(answer.status) \(answer.headers) \(answer.body)")
            let refused = try await standIn.revoke("anything", secret: secret, clientID: clientID)
            #expect(refused.appleError == .invalidClient, "\(refused.status) \(refused.body)")
            #expect(try await standIn.exchange(code).status == 200)
        }
    }

    @Test("A secret at Apple's limits is accepted: iat within the skew, exp 15,777,000 s after it; DER is longer than 64 bytes")
    func limits() async throws {
        try await StandIn.run { standIn in
            let now = standIn.clock.now
            let atLimits = try standIn.secrets.secret(clientID: StandIn.clientID, issuedAt: now.addingTimeInterval(5), lifetime: 15_777_000)
            #expect(try await standIn.exchange(standIn.code(), secret: atLimits).status == 200)
            let expiresNow = try standIn.secrets.secret(clientID: StandIn.clientID, issuedAt: now.addingTimeInterval(-3600), lifetime: 3600)
            #expect(try await standIn.exchange(standIn.code(), secret: expiresNow).appleError == .invalidClient)
            // The DER case above fails on its encoding, not on chance: DER of a P-256 signature is never 64 bytes.
            let der = try standIn.secrets.secret(clientID: StandIn.clientID, issuedAt: now.addingTimeInterval(-60), der: true)
            #expect(try CompactJWS(der).signature.count > 64)
        }
    }

    @Test("A team's second key (rotation) signs good secrets too")
    func secondKey() async throws {
        let first = TestClientSecrets(), second = TestClientSecrets(keyID: "KEY0000002")
        let team = StandInTeam(teamID: first.teamID, keys: [first.keyID: first.key.publicKey, second.keyID: second.key.publicKey], clientIDs: ["com.example.app"])
        let check = ClientSecretCheck(teams: [team])
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        for secrets in [first, second] {
            #expect(try check.check(secrets.secret(clientID: "com.example.app", issuedAt: now.addingTimeInterval(-60)), clientID: "com.example.app", now: now).teamID == first.teamID)
        }
    }
}
