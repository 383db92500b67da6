/// Why a delivery was refused. One vocabulary for the endpoint, the CLI's `verify` and the
/// rejection records.
package enum RejectionReason: String, Sendable, CaseIterable, Codable {
    // 401 invalid_token
    case badSignature = "bad_signature"
    case unknownKey = "unknown_key"
    case unsupportedAlgorithm = "unsupported_algorithm"
    /// A `crit` header: extensions we would have to understand to verify (RFC 7515 §4.1.11).
    case unsupportedHeader = "unsupported_header"
    case wrongIssuer = "wrong_issuer"
    case wrongAudience = "wrong_audience"
    case expired
    case notYetValid = "not_yet_valid"
    /// No `exp`: Apple's notifications and identity tokens always carry one.
    case missingExpiry = "missing_expiry"
    // identity tokens only (POST /v1/sessions): the nonce the backend gave does not match
    case nonceMismatch = "nonce_mismatch"
    // 400 malformed_request and the other refusals, recorded with the same machinery
    case malformedRequest = "malformed_request"
    case payloadTooLarge = "payload_too_large"
}

/// A verification failure decided by the pure rules; the HTTP edge maps it to a status.
package enum VerificationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not a readable notification at all (HTTP 400 `malformed_request`).
    case malformed(String)
    /// A readable token that is not acceptable (HTTP 401 `invalid_token` with `reason`).
    case invalid(RejectionReason, String)

    package var reason: RejectionReason {
        switch self {
        case .malformed: .malformedRequest
        case .invalid(let reason, _): reason
        }
    }

    package var message: String {
        switch self {
        case .malformed(let message), .invalid(_, let message): message
        }
    }

    package var description: String { "\(reason.rawValue): \(message)" }
}
