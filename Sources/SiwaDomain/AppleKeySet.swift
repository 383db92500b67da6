import Crypto
import CryptoExtras
import Foundation
import JWTKit

/// One of Apple's signing keys, ready to check RS256 signatures.
package struct AppleKey: Sendable {
    package let kid: String
    package let publicKey: _RSA.Signing.PublicKey
    /// The key as published (JWK JSON), kept so a rejection can be re-checked later with the very key.
    package let jwkJSON: String
}

/// An immutable snapshot of a JWKS, indexed by `kid`.
///
/// The verifier never falls back to "a default key": jwt-kit's `JWTKeyCollection` verifies a token
/// with an unknown `kid` against its default key, which would hide Apple's key rotation (an unknown
/// `kid` must trigger a refresh) and blur "unknown key" with "bad signature". So the `kid` is resolved
/// here, explicitly, and only RSA keys usable for RS256 are kept.
package struct AppleKeySet: Sendable {
    package let keys: [String: AppleKey]
    /// The JWKS document this set was built from, as fetched (persisted so a restart works offline).
    package let document: Data

    package struct InvalidDocument: Error, CustomStringConvertible {
        package let description: String
    }

    package init(keys: [AppleKey], document: Data) {
        self.keys = Dictionary(keys.map { ($0.kid, $0) }, uniquingKeysWith: { first, _ in first })
        self.document = document
    }

    package static let empty = AppleKeySet(keys: [], document: Data(#"{"keys":[]}"#.utf8))

    /// Parses a JWKS document (`{"keys": [...]}`) with jwt-kit's JWK model. Keys that are not RSA,
    /// declare another algorithm, lack a `kid` or are weaker than 2048 bits are left out; a document
    /// with no usable key is an error (keeping the last good set is the caller's decision).
    package static func parse(_ document: Data) throws(InvalidDocument) -> AppleKeySet {
        let jwks: JWKS
        do {
            jwks = try JSONDecoder().decode(JWKS.self, from: document)
        } catch {
            throw InvalidDocument(description: "not a JWKS document (expected {\"keys\": [...]}): \(error)")
        }
        var keys: [AppleKey] = []
        for jwk in jwks.keys {
            guard jwk.keyType == .rsa, jwk.algorithm == nil || jwk.algorithm == .rs256,
                let kid = jwk.keyIdentifier?.string, !kid.isEmpty,
                let modulus = jwk.modulus.flatMap({ Base64URL.decode($0) }),
                let exponent = jwk.exponent.flatMap({ Base64URL.decode($0) }),
                let publicKey = try? _RSA.Signing.PublicKey(n: modulus, e: exponent),
                publicKey.keySizeInBits >= 2048
            else { continue }
            let jwkJSON = (try? JSONEncoder().encode(jwk)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
            keys.append(AppleKey(kid: kid, publicKey: publicKey, jwkJSON: jwkJSON))
        }
        guard !keys.isEmpty else {
            throw InvalidDocument(description: "the JWKS document holds no RSA key usable for RS256")
        }
        return AppleKeySet(keys: keys, document: document)
    }

    /// Builds a one-key set from a stored JWK (used to re-check a recorded rejection).
    package static func single(jwkJSON: String) throws(InvalidDocument) -> AppleKeySet {
        try parse(Data(#"{"keys":[\#(jwkJSON)]}"#.utf8))
    }

    package subscript(kid: String) -> AppleKey? { keys[kid] }
    package var kids: [String] { keys.keys.sorted() }
}
