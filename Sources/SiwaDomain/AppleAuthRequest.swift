import Crypto
import Foundation

package enum AppleAuthEndpoint: String, Sendable, Hashable {
    case token = "/auth/token"
    case revoke = "/auth/revoke"
}

package enum AppleGrantType: String, Sendable, Hashable {
    case authorizationCode = "authorization_code"
    case refreshToken = "refresh_token"
}

/// Which token `/auth/revoke` is given (its `token_type_hint`).
package enum AppleTokenKind: String, Sendable, Hashable {
    case refreshToken = "refresh_token"
    case accessToken = "access_token"
}

/// One call to Apple's auth endpoints: where it goes and the exact form fields it sends.
package enum AppleAuthRequest: Sendable, CustomStringConvertible, CustomReflectable {
    /// Sign-in completion; `redirectURI` only when the authorization request had one (web).
    case exchange(code: String, redirectURI: String?)
    case refresh(refreshToken: String)
    case revoke(token: String, hint: AppleTokenKind)

    package var endpoint: AppleAuthEndpoint {
        switch self {
        case .exchange, .refresh: .token
        case .revoke: .revoke
        }
    }

    package var grantType: AppleGrantType? {
        switch self {
        case .exchange: .authorizationCode
        case .refresh: .refreshToken
        case .revoke: nil
        }
    }

    /// The code or token the call carries.
    private var credential: String {
        switch self {
        case .exchange(let code, _): code
        case .refresh(let token), .revoke(let token, _): token
        }
    }

    /// The form fields, in Apple's documented order.
    package func fields(clientID: String, clientSecret: String) -> [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = [(name: "client_id", value: clientID), (name: "client_secret", value: clientSecret)]
        switch self {
        case .exchange(let code, let redirectURI):
            fields.append((name: "code", value: code))
            fields.append((name: "grant_type", value: AppleGrantType.authorizationCode.rawValue))
            if let redirectURI { fields.append((name: "redirect_uri", value: redirectURI)) }
        case .refresh(let token):
            fields.append((name: "grant_type", value: AppleGrantType.refreshToken.rawValue))
            fields.append((name: "refresh_token", value: token))
        case .revoke(let token, let hint):
            fields.append((name: "token", value: token))
            fields.append((name: "token_type_hint", value: hint.rawValue))
        }
        return fields
    }

    /// What is safe to keep about this call, before its answer is known.
    package func record(clientID: String) -> AppleAuthRecord {
        var hint: AppleTokenKind?
        if case .revoke(_, let kind) = self { hint = kind }
        return AppleAuthRecord(
            endpoint: endpoint, clientID: clientID, grantType: grantType, tokenTypeHint: hint,
            tokenFingerprint: AppleAuthRecord.fingerprint(credential))
    }

    /// Never shows the code or token.
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
    package var tokenFingerprint: String
    /// Apple's HTTP status (nil: no answer arrived).
    package var status: Int?
    /// What a refusal meant (nil: a 2xx, or no answer).
    package var error: AppleAuthError?

    package init(
        endpoint: AppleAuthEndpoint, clientID: String, grantType: AppleGrantType?, tokenTypeHint: AppleTokenKind?, tokenFingerprint: String,
        status: Int? = nil, error: AppleAuthError? = nil
    ) {
        self.endpoint = endpoint
        self.clientID = clientID
        self.grantType = grantType
        self.tokenTypeHint = tokenTypeHint
        self.tokenFingerprint = tokenFingerprint
        self.status = status
        self.error = error
    }

    /// The first 12 hex digits of the token's SHA-256: tells tokens apart, reveals none.
    package static func fingerprint(_ token: String) -> String {
        SHA256.hash(data: Data(token.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    package var description: String {
        var parts = ["\(endpoint.rawValue)", "client_id=\(clientID)"]
        if let grantType { parts.append("grant_type=\(grantType.rawValue)") }
        if let tokenTypeHint { parts.append("token_type_hint=\(tokenTypeHint.rawValue)") }
        parts.append("token=sha256:\(tokenFingerprint)")
        parts.append("status=\(status.map(String.init) ?? "none")")
        if let word = error?.word { parts.append("error=\(word)") }
        return parts.joined(separator: " ")
    }
}
