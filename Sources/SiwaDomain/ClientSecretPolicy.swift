import Foundation

/// The claims of one client secret (times in seconds since the epoch).
package struct ClientSecretClaims: Sendable, Hashable {
    /// Every client secret's `aud`.
    package static let audience = "https://appleid.apple.com"

    /// `iss`: the team ID.
    package var issuer: String
    /// `sub`: the client ID (bundle ID or Services ID) the calls are for.
    package var subject: String
    package var issuedAt: Int64
    package var expiresAt: Int64

    package var json: JSONValue {
        [
            "iss": .string(issuer), "sub": .string(subject), "aud": .string(Self.audience),
            "iat": .number(Double(issuedAt)), "exp": .number(Double(expiresAt)),
        ]
    }
}

/// What Apple accepts as a client secret and when ours must be renewed. Apple refuses an `iat` in
/// the future (`invalid_client`), so it is backdated against clock skew; `exp` is at most
/// 15,777,000 s after `iat`. A short lifetime, renewed a margin before `exp`, never lapses unseen.
package struct ClientSecretPolicy: Sendable {
    package struct Invalid: Error, Sendable, Equatable, CustomStringConvertible {
        package var description: String
    }

    /// Apple's limit on `exp` - `iat` (six months).
    package static let maximumLifetime: Duration = .seconds(15_777_000)

    package let teamID: String
    package let lifetime: Duration
    /// How far `iat` is put before `now`.
    package let backdate: Duration
    /// A cached secret this close to its `exp` is replaced.
    package let renewalMargin: Duration

    package init(
        teamID: String, lifetime: Duration = .seconds(3600), backdate: Duration = .seconds(60), renewalMargin: Duration = .seconds(300)
    ) throws(Invalid) {
        guard Self.isAppleIdentifier(teamID) else {
            throw Invalid(description: "the team ID must be 10 characters, A-Z and 0-9 (got \"\(UntrustedText.bounded(teamID, limit: 32))\")")
        }
        guard lifetime >= .seconds(1), lifetime <= Self.maximumLifetime else {
            throw Invalid(description: "a client secret's lifetime must be 1 s to 15777000 s, Apple's limit (got \(lifetime.components.seconds) s)")
        }
        guard backdate >= .zero, backdate < lifetime else {
            throw Invalid(description: "the client secret's backdate must be at least 0 s and shorter than its lifetime")
        }
        guard renewalMargin >= .zero, renewalMargin < lifetime - backdate else {
            throw Invalid(description: "the client secret's renewal margin must be at least 0 s and shorter than its lifetime less the backdate")
        }
        self.teamID = teamID
        self.lifetime = lifetime
        self.backdate = backdate
        self.renewalMargin = renewalMargin
    }

    /// Team IDs and key IDs: 10 characters, A-Z and 0-9.
    package static func isAppleIdentifier(_ text: String) -> Bool {
        text.utf8.count == 10 && text.utf8.allSatisfy { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
    }

    /// The header of a secret signed with key `keyID`.
    package static func header(keyID: String) -> JSONValue {
        ["alg": "ES256", "kid": .string(keyID)]
    }

    /// The claims of a secret for `clientID` minted at `now`.
    package func claims(clientID: String, now: Date) -> ClientSecretClaims {
        let issuedAt = Self.seconds(now) - backdate.components.seconds
        return ClientSecretClaims(issuer: teamID, subject: clientID, issuedAt: issuedAt, expiresAt: issuedAt + lifetime.components.seconds)
    }

    /// True once `now` is within the margin of `exp`, or before `iat` (the clock went back).
    package func needsRenewal(_ claims: ClientSecretClaims, now: Date) -> Bool {
        let now = Self.seconds(now)
        return now >= claims.expiresAt - renewalMargin.components.seconds || now < claims.issuedAt
    }

    private static func seconds(_ date: Date) -> Int64 { Int64(date.timeIntervalSince1970.rounded(.down)) }
}
