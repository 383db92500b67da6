import Foundation

/// Decides which rejected deliveries get a row: at most `limitPerMinute` per reason per minute;
/// the rest are only counted. Forged traffic must not be able to use up the database's commit
/// capacity or disk, while "why didn't it arrive?" still has examples of every reason.
///
/// A genuine token for another bundle ID (`wrong_audience`, Apple's signature valid) is kept whole,
/// so it can be replayed once a mistyped SIWA_APPLE_BUNDLE_IDS is fixed — but at most
/// `tokensPerAudiencePerHour` per `aud` per hour: Apple signs every app's notifications with the
/// same keys, so anyone can post their own app's (with their users' addresses) here. The rest go
/// through the per-minute sampling like any rejection, without their token.
package struct RejectionSampler: Sendable {
    /// What becomes of one rejection.
    package enum Admission: Sendable, Equatable {
        /// A row with the whole token.
        case rowWithToken
        /// A row without the token.
        case row
        /// Counted only.
        case counted
    }

    package let limitPerMinute: Int
    package let tokensPerAudiencePerHour: Int
    /// Audiences tracked per hour at most (state bounded whatever the traffic).
    static let maximumAudiences = 1000
    private var windows: [RejectionReason: (minute: Int64, admitted: Int)] = [:]
    private var keptTokens: (hour: Int64, perAudience: [String: Int]) = (0, [:])

    /// Unless configured (`SIWA_OTHER_APP_TOKENS_PER_HOUR`).
    package static let defaultTokensPerAudiencePerHour = 20

    package init(limitPerMinute: Int, tokensPerAudiencePerHour: Int = RejectionSampler.defaultTokensPerAudiencePerHour) {
        self.limitPerMinute = limitPerMinute
        self.tokensPerAudiencePerHour = tokensPerAudiencePerHour
    }

    /// The minute bucket of a time (floor, UTC).
    package static func minute(of date: Date) -> Date {
        Date(timeIntervalSince1970: (date.timeIntervalSince1970 / 60).rounded(.down) * 60)
    }

    /// `genuineTokenAudience`: the `aud` of a rejection whose token Apple signed (nil otherwise).
    package mutating func admit(_ reason: RejectionReason, at date: Date, genuineTokenAudience: String?) -> Admission {
        if let aud = genuineTokenAudience, keepToken(aud: aud, at: date) { return .rowWithToken }
        let minute = Int64((date.timeIntervalSince1970 / 60).rounded(.down))
        var window = windows[reason] ?? (minute, 0)
        if window.minute != minute { window = (minute, 0) }
        let admitted = window.admitted < limitPerMinute
        if admitted { window.admitted += 1 }
        windows[reason] = window
        return admitted ? .row : .counted
    }

    private mutating func keepToken(aud: String, at date: Date) -> Bool {
        let hour = Int64((date.timeIntervalSince1970 / 3600).rounded(.down))
        if keptTokens.hour != hour { keptTokens = (hour, [:]) }
        let kept = keptTokens.perAudience[aud] ?? 0
        guard kept < tokensPerAudiencePerHour, kept > 0 || keptTokens.perAudience.count < Self.maximumAudiences else { return false }
        keptTokens.perAudience[aud] = kept + 1
        return true
    }
}
