import Foundation

/// What Apple's `/auth/token` and `/auth/revoke` refuse with: one of six words in a 400's
/// `{"error": "..."}` (TN3107). `error_description` is undocumented and never read.
package enum AppleAuthError: Error, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case invalidRequest
    /// The client secret or client ID is wrong or expired.
    case invalidClient
    /// The code or refresh token is invalid, expired, used, or for another client.
    case invalidGrant
    case unauthorizedClient
    case unsupportedGrantType
    case invalidScope
    /// Any other answer that is not a success: its HTTP status (a 5xx, a redirect, an unknown word).
    case unrecognised(status: Int)

    package static let allCases: [AppleAuthError] = [
        .invalidRequest, .invalidClient, .invalidGrant, .unauthorizedClient, .unsupportedGrantType, .invalidScope,
    ]

    /// Apple's word for it (nil for `unrecognised`).
    package var word: String? {
        switch self {
        case .invalidRequest: "invalid_request"
        case .invalidClient: "invalid_client"
        case .invalidGrant: "invalid_grant"
        case .unauthorizedClient: "unauthorized_client"
        case .unsupportedGrantType: "unsupported_grant_type"
        case .invalidScope: "invalid_scope"
        case .unrecognised: nil
        }
    }

    package init?(word: String) {
        guard let known = Self.allCases.first(where: { $0.word == word }) else { return nil }
        self = known
    }

    /// What an answer that is not a 2xx means. The word counts on any 4xx (OAuth servers may send
    /// `invalid_client` with a 401; Apple documents 400).
    package init(status: Int, body: some DataProtocol) {
        if (400..<500).contains(status), let word = JSONValue.parse(body)?["error"]?.stringValue, let known = Self(word: word) {
            self = known
        } else {
            self = .unrecognised(status: status)
        }
    }

    package var description: String {
        if case .unrecognised(let status) = self { return "Apple answered HTTP \(status)" }
        return "Apple answered \(word!)"
    }
}
