import Foundation

/// `/auth/token`'s 200: `{access_token, token_type, expires_in, refresh_token?, id_token?}`. A
/// refresh answers without `refresh_token` and may omit `id_token`. Printing it shows no token.
package struct AppleTokenGrant: Sendable, Hashable, CustomStringConvertible, CustomReflectable {
    package var accessToken: String
    package var tokenType: String
    package var expiresIn: Int
    package var refreshToken: String?
    package var idToken: String?

    package init(accessToken: String, tokenType: String, expiresIn: Int, refreshToken: String? = nil, idToken: String? = nil) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.refreshToken = refreshToken
        self.idToken = idToken
    }

    /// Nil unless the three required fields are there with their types (an empty token counts as absent).
    package static func parse(_ body: some DataProtocol) -> AppleTokenGrant? {
        guard let json = JSONValue.parse(body),
            let accessToken = json["access_token"]?.stringValue, !accessToken.isEmpty,
            let tokenType = json["token_type"]?.stringValue,
            let expiresIn = json["expires_in"]?.numberValue, expiresIn.rounded() == expiresIn, expiresIn >= 0, expiresIn < 1e9
        else { return nil }
        func optional(_ name: String) -> String? { json[name]?.stringValue.flatMap { $0.isEmpty ? nil : $0 } }
        return AppleTokenGrant(
            accessToken: accessToken, tokenType: tokenType, expiresIn: Int(expiresIn), refreshToken: optional("refresh_token"), idToken: optional("id_token"))
    }

    package var description: String {
        "AppleTokenGrant(token_type: \(UntrustedText.bounded(tokenType, limit: 32)), expires_in: \(expiresIn), "
            + "refresh_token: \(refreshToken == nil ? "absent" : "present"), id_token: \(idToken == nil ? "absent" : "present"))"
    }

    package var customMirror: Mirror { Mirror(self, children: [:]) }
}
