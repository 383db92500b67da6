import Crypto
import Foundation
import SiwaDomain

/// A developer team as the stand-in knows it: its ID, its Sign in with Apple keys by key ID (Apple
/// allows two at once, for rotation) and the client IDs (bundle IDs, Services IDs) it owns. Two
/// teams may list the same client ID: the sender and the recipient of an app transfer.
package struct StandInTeam: Sendable {
    package var teamID: String
    package var keys: [String: P256.Signing.PublicKey]
    package var clientIDs: Set<String>

    package init(teamID: String, keys: [String: P256.Signing.PublicKey], clientIDs: Set<String>) {
        self.teamID = teamID
        self.keys = keys
        self.clientIDs = clientIDs
    }
}

/// Why a client secret was refused. Apple answers each with `invalid_client` alone; the stand-in
/// also logs the reason, so whoever mints the secret can tell what to fix.
package enum ClientSecretRejection: String, Sendable, Error, CaseIterable {
    case unknownClient = "unknown_client"
    case malformed
    case wrongAlgorithm = "wrong_algorithm"
    case unknownKey = "unknown_key"
    case badSignature = "bad_signature"
    case wrongIssuer = "wrong_issuer"
    case wrongSubject = "wrong_subject"
    case wrongAudience = "wrong_audience"
    case issuedInFuture = "issued_in_future"
    case expired
    case lifetimeTooLong = "lifetime_too_long"
}

/// Apple's checks of a client secret: an ES256 JWT whose `kid` names a key of the team owning the
/// `client_id`, signed as raw r‖s (64 bytes, not DER), with `iss` the team, `sub` the client ID,
/// `aud` Apple, `iat` not in the future and `exp` in the future, at most 15,777,000 s after `iat`.
package struct ClientSecretCheck: Sendable {
    package static let audience = NotificationVerifier.appleIssuer
    /// Six months: the longest a client secret may live.
    package static let maximumLifetime: Int64 = 15_777_000

    package var teams: [StandInTeam]
    /// How far in the future an `iat` may be (clocks differ a little; Apple's own allowance is unknown).
    package var clockSkew: Int64

    package init(teams: [StandInTeam], clockSkew: Int64 = 5) {
        self.teams = teams
        self.clockSkew = clockSkew
    }

    /// The team whose key signed `secret` for `clientID`, or why it is refused.
    @discardableResult
    package func check(_ secret: String, clientID: String, now: Date) throws(ClientSecretRejection) -> StandInTeam {
        let owners = teams.filter { $0.clientIDs.contains(clientID) }
        guard !owners.isEmpty else { throw .unknownClient }
        guard let jws = try? CompactJWS(secret) else { throw .malformed }
        guard jws.algorithm == "ES256" else { throw .wrongAlgorithm }
        // An app being transferred belongs to both teams: the key that signed says which one calls.
        guard let kid = jws.kid, let team = owners.first(where: { $0.keys[kid] != nil }), let key = team.keys[kid] else { throw .unknownKey }
        guard jws.signature.count == 64, let signature = try? P256.Signing.ECDSASignature(rawRepresentation: jws.signature),
            key.isValidSignature(signature, for: SHA256.hash(data: Data(jws.signingInput.utf8)))
        else { throw .badSignature }
        guard let claims = JSONValue.parse(jws.payload), claims.objectValue != nil else { throw .malformed }
        guard claims["iss"]?.stringValue == team.teamID else { throw .wrongIssuer }
        guard claims["sub"]?.stringValue == clientID else { throw .wrongSubject }
        guard claims["aud"]?.stringValue == Self.audience else { throw .wrongAudience }
        guard let iat = Self.seconds(claims["iat"]), let exp = Self.seconds(claims["exp"]) else { throw .malformed }
        let now = Int64(now.timeIntervalSince1970.rounded(.down))
        guard iat <= now + clockSkew else { throw .issuedInFuture }
        guard exp > now else { throw .expired }
        guard exp - iat <= Self.maximumLifetime else { throw .lifetimeTooLong }
        return team
    }

    /// A NumericDate claim as whole seconds; nil when missing or not a number in range.
    private static func seconds(_ value: JSONValue?) -> Int64? {
        guard let number = value?.numberValue, number.isFinite, abs(number) < 1e15 else { return nil }
        return Int64(number.rounded(.down))
    }
}
