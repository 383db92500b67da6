import Crypto
import Foundation

/// A Sign in with Apple identity token (id_token) that passed every check: a user Apple
/// authenticated, for one of our client IDs, in its time.
package struct VerifiedIdentity: Sendable, Equatable {
    /// The token's `aud`: the bundle ID (native app) or Services ID (web) the user signed in to.
    package var clientID: String
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?
    /// Apple's fraud signal: 0 unsupported, 1 unknown, 2 likely real.
    package var realUserStatus: Int?
    package var issuedAt: Int64
    package var expiresAt: Int64?
    /// A user whose app moved between teams, for 60 days after (TN3159): the `transfer_sub` the
    /// sending team exported, to match with. Nil when absent, not a string, empty or over 256 bytes.
    package var transferSub: String? = nil
}

/// The checks for identity tokens, which the backend hands us when a user signs in: the same
/// key set and rules as notifications (RS256 only, `kid` resolved explicitly, signature, `iss`,
/// `aud`, time claims), then what only identity tokens have — a `sub`, no `events`, and the
/// `nonce` the app chose, when the backend gives it.
///
/// The nonce: an app generates a random nonce, passes SHA-256(nonce) as hex to Apple, and Apple
/// embeds that hash in the token. The backend sends us the raw nonce; we hash it and compare, so a
/// stolen token (which shows only the hash) cannot be replayed with a nonce check.
package struct IdentityTokenVerifier: Sendable {
    /// Client IDs accepted as `aud` (`SIWA_APPLE_CLIENT_IDS`).
    package var clientIDs: Set<String>
    package var clockSkew: Duration

    package init(clientIDs: Set<String>, clockSkew: Duration = NotificationVerifier.defaultClockSkew) {
        self.clientIDs = clientIDs
        self.clockSkew = clockSkew
    }

    package func verify(_ text: String, keys: AppleKeySet, nonce: String?, now: Date) throws(VerificationError) -> VerifiedIdentity {
        let jws = try CompactJWS(text)
        let key = try NotificationVerifier.resolveKey(jws, in: keys)
        return try verify(jws, key: key, nonce: nonce, now: now)
    }

    package func verify(_ jws: CompactJWS, key: AppleKey, nonce: String?, now: Date) throws(VerificationError) -> VerifiedIdentity {
        let checked = try NotificationVerifier.checkSignedClaims(
            jws, key: key, audiences: clientIDs, audienceDescription: "a configured client ID (SIWA_APPLE_CLIENT_IDS)", now: now,
            clockSkew: clockSkew
        ) { claims throws(VerificationError) in
            if claims["events"] != nil {
                throw .malformed("this is a server-to-server notification, not an identity token: POST it to /apple/notifications")
            }
        }
        let claims = checked.claims
        guard let sub = claims["sub"]?.stringValue, !sub.isEmpty else {
            throw .malformed("the identity token has no sub")
        }
        if let nonce {
            let expected = Self.nonceHash(nonce)
            guard let embedded = claims["nonce"]?.stringValue else {
                throw .invalid(.nonceMismatch, "a nonce was given but the token has none: the app did not pass a nonce to Apple")
            }
            guard embedded == expected else {
                throw .invalid(.nonceMismatch, "the token's nonce is not the SHA-256 of the given nonce")
            }
        }
        return VerifiedIdentity(
            clientID: checked.aud, sub: sub, email: claims["email"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 },
            isPrivateEmail: Self.flag(claims["is_private_email"]),
            realUserStatus: claims["real_user_status"]?.numberValue.flatMap { $0 == $0.rounded() && abs($0) < 1000 ? Int($0) : nil },
            issuedAt: checked.issuedAt, expiresAt: checked.expiresAt,
            transferSub: claims["transfer_sub"]?.stringValue.flatMap { $0.isEmpty || $0.utf8.count > AppleTransferSub.maximumLength ? nil : $0 })
    }

    /// What Apple embeds for the raw nonce an app chose: its SHA-256 as lowercase hex.
    package static func nonceHash(_ nonce: String) -> String {
        SHA256.hash(data: Data(nonce.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// Apple sends booleans as JSON booleans or as the strings "true"/"false".
    private static func flag(_ value: JSONValue?) -> Bool? {
        switch value {
        case .bool(let flag): flag
        case .string("true"): true
        case .string("false"): false
        default: nil
        }
    }
}
