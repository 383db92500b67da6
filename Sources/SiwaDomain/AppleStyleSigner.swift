import Crypto
import CryptoExtras
import Foundation

/// Signs notifications exactly as Apple does — RS256, `{"kid","alg"}` header, `events` as a JSON
/// *string*, `event_time` in milliseconds, `exp` = `iat` + 86400 — with a local key. The stand-in
/// for Apple behind `keys generate` / `send`, the tests and the benchmark.
package struct AppleStyleSigner: Sendable {
    package let kid: String
    package let privateKey: _RSA.Signing.PrivateKey

    package init(kid: String, privateKey: _RSA.Signing.PrivateKey) {
        self.kid = kid
        self.privateKey = privateKey
    }

    /// A fresh RSA-2048 key; its `kid` is derived from the modulus.
    package static func generate() throws -> AppleStyleSigner {
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let modulus = try key.publicKey.getKeyPrimitives().modulus
        let kid = String(Base64URL.encode(Data(SHA256.hash(data: modulus))).prefix(10))
        return AppleStyleSigner(kid: kid, privateKey: key)
    }

    package init(pem: String) throws {
        let key = try _RSA.Signing.PrivateKey(pemRepresentation: pem)
        let modulus = try key.publicKey.getKeyPrimitives().modulus
        self.init(kid: String(Base64URL.encode(Data(SHA256.hash(data: modulus))).prefix(10)), privateKey: key)
    }

    package var privateKeyPEM: String { privateKey.pemRepresentation }

    /// The public half as a JWKS document, the shape Apple publishes.
    package func jwksDocument() throws -> Data {
        let primitives = try privateKey.publicKey.getKeyPrimitives()
        let jwk: JSONValue = .object([
            "kty": .string("RSA"), "kid": .string(kid), "use": .string("sig"), "alg": .string("RS256"),
            "n": .string(Base64URL.encode(primitives.modulus)), "e": .string(Base64URL.encode(primitives.publicExponent)),
        ])
        return Data(JSONValue.object(["keys": .array([jwk])]).jsonText.utf8)
    }

    /// Signs arbitrary header and claims (tests use this to forge every kind of bad token).
    package func sign(header: JSONValue, claims: JSONValue) throws -> String {
        try sign(header: header, payload: Data(claims.jsonText.utf8))
    }

    /// Signs an arbitrary payload, byte for byte (tests: bytes no JSON writer would produce).
    package func sign(header: JSONValue, payload: Data) throws -> String {
        let input = Base64URL.encode(Data(header.jsonText.utf8)) + "." + Base64URL.encode(payload)
        let signature = try privateKey.signature(for: SHA256.hash(data: Data(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64URL.encode(signature.rawRepresentation)
    }

    /// Apple's claims for one event, as real tokens carry them.
    package static func claims(
        aud: String, type: String, sub: String, eventTime: Date, email: String? = nil, isPrivateEmail: Bool? = nil,
        issuedAt: Date, jti: String = UUID().uuidString
    ) -> JSONValue {
        var event: [String: JSONValue] = [
            "type": .string(type), "sub": .string(sub),
            "event_time": .number((eventTime.timeIntervalSince1970 * 1000).rounded(.down)),
        ]
        if let email { event["email"] = .string(email) }
        if let isPrivateEmail { event["is_private_email"] = .string(isPrivateEmail ? "true" : "false") }
        let iat = issuedAt.timeIntervalSince1970.rounded(.down)
        return .object([
            "iss": .string(NotificationVerifier.appleIssuer), "aud": .string(aud),
            "iat": .number(iat), "exp": .number(iat + 86_400), "jti": .string(jti),
            "events": .string(JSONValue.object(event).jsonText),
        ])
    }

    /// A signed notification as Apple would POST it: returns the compact JWS.
    package func notification(
        aud: String, type: String, sub: String, eventTime: Date = Date(), email: String? = nil, isPrivateEmail: Bool? = nil,
        issuedAt: Date = Date(), jti: String = UUID().uuidString
    ) throws -> String {
        try sign(
            header: .object(["kid": .string(kid), "alg": .string("RS256")]),
            claims: Self.claims(
                aud: aud, type: type, sub: sub, eventTime: eventTime, email: email, isPrivateEmail: isPrivateEmail,
                issuedAt: issuedAt, jti: jti)
        )
    }

    /// A signed identity token (id_token) as Apple returns it to an app at sign-in.
    package func identityToken(
        aud: String, sub: String, email: String? = nil, isPrivateEmail: Bool? = nil, nonce: String? = nil, realUserStatus: Int? = 2,
        issuedAt: Date = Date(), transferSub: String? = nil
    ) throws -> String {
        let iat = issuedAt.timeIntervalSince1970.rounded(.down)
        var claims: [String: JSONValue] = [
            "iss": .string(NotificationVerifier.appleIssuer), "aud": .string(aud), "sub": .string(sub), "iat": .number(iat),
            "exp": .number(iat + 600), "auth_time": .number(iat), "nonce_supported": .bool(true),
        ]
        if let email { claims["email"] = .string(email); claims["email_verified"] = .bool(true) }
        if let isPrivateEmail { claims["is_private_email"] = .bool(isPrivateEmail) }
        if let nonce { claims["nonce"] = .string(nonce) }
        if let realUserStatus { claims["real_user_status"] = .number(Double(realUserStatus)) }
        if let transferSub { claims["transfer_sub"] = .string(transferSub) }
        return try sign(header: .object(["kid": .string(kid), "alg": .string("RS256")]), claims: .object(claims))
    }

    /// Apple's POST body for a compact JWS.
    package static func body(_ jws: String) -> String {
        JSONValue.object(["payload": .string(jws)]).jsonText
    }
}
