import Foundation

/// `/auth/token`'s 200 for `client_credentials` (TN3159): `{access_token, token_type, expires_in}`,
/// the Bearer for `/auth/usermigrationinfo`. Printing it shows no token.
package struct AppleMigrationToken: Sendable, Hashable, CustomStringConvertible, CustomReflectable {
    package var accessToken: String
    /// Seconds from issue (Apple's: 3600).
    package var expiresIn: Int

    package init(accessToken: String, expiresIn: Int) {
        self.accessToken = accessToken
        self.expiresIn = expiresIn
    }

    /// Nil unless `access_token` is a non-empty string and `expires_in` a whole number of seconds.
    package static func parse(_ body: some DataProtocol) -> AppleMigrationToken? {
        guard let json = JSONValue.parse(body), let accessToken = json["access_token"]?.stringValue, !accessToken.isEmpty,
            let expiresIn = json["expires_in"]?.numberValue, expiresIn.rounded() == expiresIn, expiresIn >= 0, expiresIn < 1e9
        else { return nil }
        return AppleMigrationToken(accessToken: accessToken, expiresIn: Int(expiresIn))
    }

    /// Whether a token received at `issuedAt` may still be sent at `now`: until `margin` seconds
    /// before it expires, so a call in flight does not carry a token that lapses on the way.
    package func isUsable(issuedAt: Date, now: Date, margin: TimeInterval) -> Bool {
        now >= issuedAt && now.timeIntervalSince(issuedAt) < TimeInterval(expiresIn) - margin
    }

    package var description: String { "AppleMigrationToken(expires_in: \(expiresIn))" }
    package var customMirror: Mirror { Mirror(self, children: [:]) }
}

/// The sending team's answer from `/auth/usermigrationinfo`: `{"transfer_sub": "…"}`.
package enum AppleTransferSub {
    /// Longer than any identifier Apple issues: a longer value is not an answer.
    package static let maximumLength = 256

    /// The `transfer_sub`, or nil when the body has no non-empty one within `maximumLength`.
    package static func parse(_ body: some DataProtocol) -> String? {
        guard let value = JSONValue.parse(body)?["transfer_sub"]?.stringValue, !value.isEmpty, value.utf8.count <= maximumLength else { return nil }
        return value
    }
}

/// The receiving team's answer from `/auth/usermigrationinfo`: the user's `sub` in our team and,
/// for a private-relay user only, a new relay `email`. Printing it shows neither sub nor email.
package struct AppleMigratedUser: Sendable, Hashable, CustomStringConvertible, CustomReflectable {
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?

    package init(sub: String, email: String? = nil, isPrivateEmail: Bool? = nil) {
        self.sub = sub
        self.email = email
        self.isPrivateEmail = isPrivateEmail
    }

    /// Nil without a non-empty `sub` (bounded as a transfer_sub); an empty or non-string `email`
    /// is absent; `is_private_email` is a boolean or, as Apple also sends it, "true"/"false".
    package static func parse(_ body: some DataProtocol) -> AppleMigratedUser? {
        guard let json = JSONValue.parse(body), let sub = json["sub"]?.stringValue, !sub.isEmpty,
            sub.utf8.count <= AppleTransferSub.maximumLength
        else { return nil }
        let email = json["email"]?.stringValue.flatMap { $0.isEmpty || $0.utf8.count > 320 ? nil : $0 }
        let isPrivateEmail: Bool? =
            switch json["is_private_email"] {
            case .bool(let flag)?: flag
            case .string("true")?: true
            case .string("false")?: false
            default: nil
            }
        return AppleMigratedUser(sub: sub, email: email, isPrivateEmail: isPrivateEmail)
    }

    package var description: String {
        "AppleMigratedUser(sub: sha256:\(AppleAuthRecord.fingerprint(sub)), email: \(email == nil ? "absent" : "present"), "
            + "is_private_email: \(isPrivateEmail.map(String.init) ?? "absent"))"
    }

    package var customMirror: Mirror { Mirror(self, children: [:]) }
}
