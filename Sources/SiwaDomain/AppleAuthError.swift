/// The error words of Apple's auth endpoints (`/auth/token`, `/auth/revoke`): an HTTP 400 with
/// `{"error": "<word>"}` (TN3107). Apple's `error_description` is undocumented, so only the word counts.
package enum AppleAuthError: String, Sendable, CaseIterable, Error {
    case invalidRequest = "invalid_request"
    case invalidClient = "invalid_client"
    case invalidGrant = "invalid_grant"
    case unauthorizedClient = "unauthorized_client"
    case unsupportedGrantType = "unsupported_grant_type"
    case invalidScope = "invalid_scope"
}
