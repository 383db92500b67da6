import Crypto
import CryptoExtras
import Foundation

/// A notification that passed every check: it came from Apple, for one of our apps, in its time.
package struct VerifiedNotification: Sendable {
    package var jti: String
    /// True when the token had no `jti` and `jti` is the SHA-256 of its payload segment.
    package var jtiDerived: Bool
    package var aud: String
    package var kid: String
    package var issuedAt: Int64
    package var expiresAt: Int64?
    package var headerJSON: String
    package var claimsJSON: String
    package var claims: JSONValue
    package var decoding: EventDecoding

    /// The user, whenever the event names one (also for an event skipped as unreadable).
    package var sub: String? { decoding.event?.sub ?? EventDecoding.subject(of: claims["events"]) }
}

/// The checks, in order, that decide whether a delivery is a genuine Sign in with Apple
/// notification for us. Pure: keys and `now` are passed in, nothing is read from the world.
///
/// Order (each failing with its own answer): JWS shape → `alg` is RS256 → `kid` resolves →
/// signature → `iss` → `aud` ∈ configured bundle IDs → `exp` (required) and `iat`, with a
/// clock-skew allowance → the event, decoded with every tolerance real tokens need.
package struct NotificationVerifier: Sendable {
    package static let appleIssuer = "https://appleid.apple.com"

    /// Bundle IDs accepted as `aud`.
    package var audiences: Set<String>
    /// Allowance for clocks that disagree, applied to `exp`, `iat` and `nbf`.
    package var clockSkew: Duration

    /// The allowance on `exp`, `iat` and `nbf` unless configured (`SIWA_CLOCK_SKEW`).
    package static let defaultClockSkew: Duration = .seconds(60)

    package init(audiences: Set<String>, clockSkew: Duration = NotificationVerifier.defaultClockSkew) {
        self.audiences = audiences
        self.clockSkew = clockSkew
    }

    /// The header rule (RS256 and a `kid`; see `CompactJWS.checkHeader()`). Returns the `kid`.
    package static func checkHeader(_ jws: CompactJWS) throws(VerificationError) -> String {
        try jws.checkHeader()
    }

    /// Resolves the header's `kid` in `keys`, explicitly (no default-key fallback).
    package static func resolveKey(_ jws: CompactJWS, in keys: AppleKeySet) throws(VerificationError) -> AppleKey {
        let kid = try checkHeader(jws)
        guard let key = keys[kid] else {
            throw .invalid(.unknownKey, "no Apple key with kid \(kid) (known: \(keys.kids.joined(separator: ", ")))")
        }
        return key
    }

    /// Verifies the signature with `key`, then the claims at `now`, then decodes the event.
    package func verify(_ jws: CompactJWS, key: AppleKey, now: Date) throws(VerificationError) -> VerifiedNotification {
        let checked = try Self.checkSignedClaims(
            jws, key: key, audiences: audiences, audienceDescription: "a configured bundle ID (SIWA_APPLE_BUNDLE_IDS)", now: now, clockSkew: clockSkew
        ) { claims throws(VerificationError) in
            if claims["events"] == nil, claims["sub"] != nil {
                throw .malformed("this is a Sign in with Apple identity token (id_token), not a server-to-server notification: it has no events claim")
            }
        }
        let claims = checked.claims
        let jti = claims["jti"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 }
        return VerifiedNotification(
            jti: jti ?? Self.derivedID(payloadSegment: jws.payloadSegment),
            jtiDerived: jti == nil,
            aud: checked.aud,
            kid: key.kid,
            issuedAt: checked.issuedAt,
            expiresAt: checked.expiresAt,
            headerJSON: jws.headerJSON,
            claimsJSON: String(decoding: jws.payload, as: UTF8.self),
            claims: claims,
            decoding: EventDecoding.decode(events: claims["events"], issuedAt: checked.issuedAt)
        )
    }

    /// What every Apple-signed token must pass, notification or identity token, in order:
    /// header → signature with `key` → JSON claims → `iss` → `aud` ∈ `audiences` → `kind`-specific
    /// checks (`shape`) → time claims at `now` with `clockSkew`.
    package static func checkSignedClaims(
        _ jws: CompactJWS, key: AppleKey, audiences: Set<String>, audienceDescription: String, now: Date, clockSkew: Duration,
        shape: (JSONValue) throws(VerificationError) -> Void
    ) throws(VerificationError) -> (claims: JSONValue, aud: String, issuedAt: Int64, expiresAt: Int64) {
        _ = try checkHeader(jws)
        let signature = _RSA.Signing.RSASignature(rawRepresentation: jws.signature)
        let digest = SHA256.hash(data: Data(jws.signingInput.utf8))
        guard key.publicKey.isValidSignature(signature, for: digest, padding: .insecurePKCS1v1_5) else {
            throw .invalid(.badSignature, "the signature does not match Apple key \(key.kid)")
        }
        guard let claims = JSONValue.parse(jws.payload), claims.objectValue != nil else {
            throw .malformed("the JWS payload is not a JSON object")
        }
        let iss = claims["iss"]?.stringValue
        guard iss == appleIssuer else {
            throw .invalid(.wrongIssuer, "iss is \(iss.map { "\"\($0)\"" } ?? "missing"); expected \(appleIssuer)")
        }
        let tokenAudiences: [String] =
            switch claims["aud"] {
            case .string(let aud): [aud]
            case .array(let values): values.compactMap(\.stringValue)
            default: []
            }
        guard let aud = tokenAudiences.first(where: audiences.contains) else {
            throw .invalid(
                .wrongAudience,
                "aud \(tokenAudiences.isEmpty ? "(missing)" : tokenAudiences.joined(separator: ",")) is not \(audienceDescription)"
            )
        }
        try shape(claims)
        if jws.payload.containsNUL || jws.payload.containsSequence(Array("\\u0000".utf8)) {
            throw .malformed("the claims contain a NUL character, which cannot be stored")
        }
        let skew = clockSkew.timeInterval
        let nowSeconds = now.timeIntervalSince1970
        guard let iat = try epochSeconds(claims, "iat") else {
            throw .malformed("the iat claim is missing")
        }
        guard let exp = try epochSeconds(claims, "exp") else {
            throw .invalid(.missingExpiry, "the token has no exp claim; Apple's tokens always carry one")
        }
        if nowSeconds > exp + skew {
            throw .invalid(.expired, "the token expired at \(iso(exp)); it is now \(iso(nowSeconds))")
        }
        if iat > nowSeconds + skew {
            throw .invalid(.notYetValid, "the token was issued at \(iso(iat)), in the future (now \(iso(nowSeconds)))")
        }
        if let nbf = try epochSeconds(claims, "nbf"), nbf > nowSeconds + skew {
            throw .invalid(.notYetValid, "the token is not valid before \(iso(nbf)) (now \(iso(nowSeconds)))")
        }
        return (claims, aud, Int64(iat), Int64(exp))
    }

    /// Parse, resolve and verify in one call: what the CLI's `verify` and a replay use.
    package func verify(_ text: String, keys: AppleKeySet, now: Date) throws(VerificationError) -> VerifiedNotification {
        let jws = try CompactJWS(text)
        let key = try Self.resolveKey(jws, in: keys)
        return try verify(jws, key: key, now: now)
    }

    /// A time claim: absent → nil; present, it must be a number of seconds between 1970 and 5138.
    private static func epochSeconds(_ claims: JSONValue, _ name: String) throws(VerificationError) -> Double? {
        guard let value = claims[name] else { return nil }
        guard let seconds = value.numberValue, seconds.isFinite, seconds >= 0, seconds < EventDecoding.millisecondsThreshold else {
            throw .malformed("the \(name) claim is not a time in seconds since 1970")
        }
        return seconds
    }

    /// The id of a token without `jti`: hex SHA-256 of its payload segment.
    package static func derivedID(payloadSegment: Substring) -> String {
        SHA256.hash(data: Data(payloadSegment.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    private static func iso(_ seconds: Double) -> String {
        Date(timeIntervalSince1970: seconds).formatted(.iso8601)
    }
}

extension Data {
    /// A zero byte anywhere (`memchr`: `contains(0)` walks `Data`'s iterator a byte at a time).
    fileprivate var containsNUL: Bool {
        withUnsafeBytes { bytes in bytes.baseAddress.map { memchr($0, 0, bytes.count) != nil } ?? false }
    }

    /// Byte-sequence search, without bridging to strings.
    fileprivate func containsSequence(_ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, count >= needle.count else { return false }
        return withUnsafeBytes { haystack in
            let last = haystack.count - needle.count
            var index = 0
            while index <= last {
                if haystack[index] == needle[0] {
                    var offset = 1
                    while offset < needle.count && haystack[index + offset] == needle[offset] { offset += 1 }
                    if offset == needle.count { return true }
                }
                index += 1
            }
            return false
        }
    }
}
