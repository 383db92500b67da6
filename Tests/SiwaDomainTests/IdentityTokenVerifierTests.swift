import Foundation
import SiwaDomain
import Testing

/// The `transfer_sub` claim Apple adds to a migrated user's identity tokens for 60 days (TN3159).
@Suite("IdentityTokenVerifier: the transfer_sub claim", .timeLimit(.minutes(10)))
struct IdentityTokenVerifierTests {
    static let signer = try! AppleStyleSigner.generate()
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func verified(_ claims: [String: JSONValue]) throws -> VerifiedIdentity {
        let iat = now.timeIntervalSince1970
        var all: [String: JSONValue] = [
            "iss": .string(NotificationVerifier.appleIssuer), "aud": "com.example.app", "sub": "001234.newsub.0001",
            "iat": .number(iat), "exp": .number(iat + 600),
        ]
        all.merge(claims) { $1 }
        let token = try Self.signer.sign(header: .object(["kid": .string(Self.signer.kid), "alg": "RS256"]), claims: .object(all))
        return try IdentityTokenVerifier(clientIDs: ["com.example.app"]).verify(
            token, keys: try AppleKeySet.parse(Self.signer.jwksDocument()), nonce: nil, now: now)
    }

    @Test("a migrated user's transfer_sub is exposed; absent, not a string, empty or over 256 bytes it is nil")
    func transferSub() throws {
        #expect(try verified(["transfer_sub": "st1.abc-def_0"]).transferSub == "st1.abc-def_0")
        #expect(try verified([:]).transferSub == nil)
        for ignored: JSONValue in [.number(7), .bool(true), "", .string(String(repeating: "x", count: 257)), .array(["st1.a"])] {
            #expect(try verified(["transfer_sub": ignored]).transferSub == nil, "\(ignored)")
        }
        #expect(try verified(["transfer_sub": .string(String(repeating: "x", count: 256))]).transferSub?.count == 256)
    }

    @Test("the stand-in signer's identityToken carries transfer_sub when given")
    func signerClaim() throws {
        let token = try Self.signer.identityToken(aud: "com.example.app", sub: "001.a.1", issuedAt: now, transferSub: "st1.xyz")
        let identity = try IdentityTokenVerifier(clientIDs: ["com.example.app"]).verify(
            token, keys: try AppleKeySet.parse(Self.signer.jwksDocument()), nonce: nil, now: now)
        #expect(identity.transferSub == "st1.xyz" && identity.sub == "001.a.1")
    }
}
