import Foundation

/// The optional daily validation of kept refresh tokens (`/auth/token`, `grant_type=refresh_token`):
/// when a token is due, and what Apple's answer means. Apple asks for at most one validation per
/// user per day; tokens fall due a day after they were kept or last validated, so the work spreads
/// over the day as sign-ins did.
package enum AppleTokenValidation {
    /// A token is validated at most this often.
    package static let interval: TimeInterval = 86_400
    /// A token claimed for validation is due again after this unless its job settles it first
    /// (a job lost with its process, or discarded after its attempts).
    package static let retryAfter: TimeInterval = 3_600

    /// What one validation found.
    package enum Verdict: Sendable, Equatable {
        /// Apple accepted the token: due again in a day.
        case valid
        /// `invalid_grant`: the user revoked us outside any notification we saw; treated like
        /// `consent-revoked` (sessions revoked, the token dropped).
        case consentLost
        /// Nothing learnt about the user: the job is retried with the queue's backoff.
        case retry
    }

    /// The verdict of an answer: `refusal` is Apple's refusal (nil: a 2xx, or no answer at all).
    package static func verdict(succeeded: Bool, refusal: AppleAuthError?) -> Verdict {
        if succeeded { return .valid }
        return refusal == .invalidGrant ? .consentLost : .retry
    }

    /// Tokens last validated (or kept) at or before this are due at `now`.
    package static func dueBefore(_ now: Date) -> Date { now.addingTimeInterval(-interval) }

    /// The `validated_at` that makes a token due again `retryAfter` from `now`: written when it is
    /// claimed, so a token whose job is lost is scheduled again in an hour, not forgotten.
    package static func claimedMark(_ now: Date) -> Date { now.addingTimeInterval(-interval + retryAfter) }
}
