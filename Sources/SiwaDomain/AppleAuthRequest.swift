import Crypto
import Foundation

package enum AppleAuthEndpoint: String, Sendable, Hashable {
    case token = "/auth/token"
    case revoke = "/auth/revoke"
    /// App transfer (TN3159): a `transfer_sub` for a user, or a transferred user's new `sub`.
    case userMigrationInfo = "/auth/usermigrationinfo"
}

package enum AppleGrantType: String, Sendable, Hashable {
    case authorizationCode = "authorization_code"
    case refreshToken = "refresh_token"
    /// The migration access token (TN3159), with `scope=user.migration`.
    case clientCredentials = "client_credentials"
}

/// The `scope` of a `client_credentials` grant: Apple knows one.
package enum AppleAuthScope: String, Sendable, Hashable {
    case userMigration = "user.migration"
}

/// Which token `/auth/revoke` is given (its `token_type_hint`).
package enum AppleTokenKind: String, Sendable, Hashable {
    case refreshToken = "refresh_token"
    case accessToken = "access_token"
}

/// One call to Apple's auth endpoints: where it goes and the exact form fields it sends.
/// The migration calls also need the access token of `.migrationToken` as a Bearer header,
/// which the caller adds: it is never a form field nor part of the record.
package enum AppleAuthRequest: Sendable, CustomStringConvertible, CustomReflectable {
    /// Sign-in completion; `redirectURI` only when the authorization request had one (web).
    case exchange(code: String, redirectURI: String?)
    case refresh(refreshToken: String)
    case revoke(token: String, hint: AppleTokenKind)
    /// The access token for `/auth/usermigrationinfo` (client_credentials, scope user.migration).
    case migrationToken
    /// Sending team: the `transfer_sub` of our user `sub` for the recipient team `target`.
    case transferSub(sub: String, target: String)
    /// Receiving team: the user (new `sub`, relay email) behind a `transfer_sub`.
    case migratedUser(transferSub: String)

    package var endpoint: AppleAuthEndpoint {
        switch self {
        case .exchange, .refresh, .migrationToken: .token
        case .revoke: .revoke
        case .transferSub, .migratedUser: .userMigrationInfo
        }
    }

    package var grantType: AppleGrantType? {
        switch self {
        case .exchange: .authorizationCode
        case .refresh: .refreshToken
        case .migrationToken: .clientCredentials
        case .revoke, .transferSub, .migratedUser: nil
        }
    }

    /// The code, token or user identifier the call carries, fingerprinted in its record
    /// (`.migrationToken` carries none: the empty string's fingerprint, e3b0c44298fc).
    private var credential: String {
        switch self {
        case .exchange(let code, _): code
        case .refresh(let token), .revoke(let token, _): token
        case .migrationToken: ""
        case .transferSub(let sub, _): sub
        case .migratedUser(let transferSub): transferSub
        }
    }

    /// The form fields, in Apple's documented order (TN3107 for sign-in, TN3159 for migration).
    package func fields(clientID: String, clientSecret: String) -> [(name: String, value: String)] {
        let client: [(name: String, value: String)] = [(name: "client_id", value: clientID), (name: "client_secret", value: clientSecret)]
        switch self {
        case .exchange(let code, let redirectURI):
            var fields = client + [(name: "code", value: code), (name: "grant_type", value: AppleGrantType.authorizationCode.rawValue)]
            if let redirectURI { fields.append((name: "redirect_uri", value: redirectURI)) }
            return fields
        case .refresh(let token):
            return client + [(name: "grant_type", value: AppleGrantType.refreshToken.rawValue), (name: "refresh_token", value: token)]
        case .revoke(let token, let hint):
            return client + [(name: "token", value: token), (name: "token_type_hint", value: hint.rawValue)]
        case .migrationToken:
            return [
                (name: "grant_type", value: AppleGrantType.clientCredentials.rawValue), (name: "scope", value: AppleAuthScope.userMigration.rawValue),
            ] + client
        case .transferSub(let sub, let target):
            return [(name: "sub", value: sub), (name: "target", value: target)] + client
        case .migratedUser(let transferSub):
            return [(name: "transfer_sub", value: transferSub)] + client
        }
    }

    /// What is safe to keep about this call, before its answer is known.
    package func record(clientID: String) -> AppleAuthRecord {
        var record = AppleAuthRecord(
            endpoint: endpoint, clientID: clientID, grantType: grantType, tokenTypeHint: nil,
            tokenFingerprint: AppleAuthRecord.fingerprint(credential))
        switch self {
        case .revoke(_, let kind): record.tokenTypeHint = kind
        case .migrationToken: record.scope = .userMigration
        case .transferSub(_, let target): record.target = target
        case .exchange, .refresh, .migratedUser: break
        }
        return record
    }

    /// Never shows the code, token or user identifier.
    package var description: String { record(clientID: "…").description }
    package var customMirror: Mirror { Mirror(self, children: [:]) }
}

/// What was sent to Apple and what it answered, safe to store and log: the token only as a
/// fingerprint. `/auth/revoke` answers 200 to any token, so this is the only proof of what was asked.
package struct AppleAuthRecord: Sendable, Hashable, CustomStringConvertible {
    package var endpoint: AppleAuthEndpoint
    package var clientID: String
    package var grantType: AppleGrantType?
    package var tokenTypeHint: AppleTokenKind?
    /// The fingerprint of the code or token sent; for `/auth/usermigrationinfo`, of the `sub`
    /// (with a `target`) or of the `transfer_sub` (without).
    package var tokenFingerprint: String
    /// `scope` of a `client_credentials` grant.
    package var scope: AppleAuthScope?
    /// The recipient team of a `transfer_sub` request (a team ID: not secret).
    package var target: String?
    /// Apple's HTTP status (nil: no answer arrived).
    package var status: Int?
    /// What a refusal meant (nil: a 2xx, or no answer).
    package var error: AppleAuthError?

    package init(
        endpoint: AppleAuthEndpoint, clientID: String, grantType: AppleGrantType?, tokenTypeHint: AppleTokenKind?, tokenFingerprint: String,
        status: Int? = nil, error: AppleAuthError? = nil, scope: AppleAuthScope? = nil, target: String? = nil
    ) {
        self.endpoint = endpoint
        self.clientID = clientID
        self.grantType = grantType
        self.tokenTypeHint = tokenTypeHint
        self.tokenFingerprint = tokenFingerprint
        self.status = status
        self.error = error
        self.scope = scope
        self.target = target
    }

    /// The first 12 hex digits of the token's SHA-256: tells tokens apart, reveals none.
    package static func fingerprint(_ token: String) -> String {
        SHA256.hash(data: Data(token.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    package var description: String {
        var parts = ["\(endpoint.rawValue)", "client_id=\(clientID)"]
        if let grantType { parts.append("grant_type=\(grantType.rawValue)") }
        if let tokenTypeHint { parts.append("token_type_hint=\(tokenTypeHint.rawValue)") }
        if let scope { parts.append("scope=\(scope.rawValue)") }
        if let target { parts.append("target=\(UntrustedText.bounded(target, limit: 32))") }
        switch (endpoint, grantType) {
        case (.userMigrationInfo, _): parts.append("\(target == nil ? "transfer_sub" : "sub")=sha256:\(tokenFingerprint)")
        case (_, .clientCredentials?): break  // sends no code or token
        default: parts.append("token=sha256:\(tokenFingerprint)")
        }
        parts.append("status=\(status.map(String.init) ?? "none")")
        if let word = error?.word { parts.append("error=\(word)") }
        return parts.joined(separator: " ")
    }
}
