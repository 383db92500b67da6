import Crypto
import Foundation
import SiwaDomain

/// A small ES256 signer for client secrets in tests, as Apple wants them (raw r‖s) or, to be
/// refused, DER. The product's minter is tested against the stand-in; this one tests the stand-in.
package struct TestClientSecrets: Sendable {
    package let teamID: String
    package let keyID: String
    package let key: P256.Signing.PrivateKey

    package init(teamID: String = "TEAM000001", keyID: String = "KEY0000001", key: P256.Signing.PrivateKey = P256.Signing.PrivateKey()) {
        self.teamID = teamID
        self.keyID = keyID
        self.key = key
    }

    /// A secret for `clientID` issued at `issuedAt`, living `lifetime` seconds; each part can be
    /// overridden to make a bad one.
    package func secret(
        clientID: String, issuedAt: Date, lifetime: Int64 = 3600, issuer: String? = nil, audience: String = "https://appleid.apple.com",
        algorithm: String = "ES256", keyID: String? = nil, der: Bool = false
    ) throws -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        return try sign(
            header: ["alg": .string(algorithm), "kid": .string(keyID ?? self.keyID)],
            claims: [
                "iss": .string(issuer ?? teamID), "sub": .string(clientID), "aud": .string(audience),
                "iat": .number(Double(iat)), "exp": .number(Double(iat + lifetime)),
            ],
            der: der)
    }

    /// Signs any header and claims with the key: raw r‖s (64 bytes), or DER when `der`.
    package func sign(header: JSONValue, claims: JSONValue, der: Bool = false) throws -> String {
        let input = Base64URL.encode(Data(header.jsonText.utf8)) + "." + Base64URL.encode(Data(claims.jsonText.utf8))
        let signature = try key.signature(for: SHA256.hash(data: Data(input.utf8)))
        return input + "." + Base64URL.encode(der ? signature.derRepresentation : signature.rawRepresentation)
    }
}
