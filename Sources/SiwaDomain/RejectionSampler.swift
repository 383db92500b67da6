import Foundation

/// Decides which rejected deliveries get a row: at most `limitPerMinute` per reason per minute;
/// the rest are only counted. Forged traffic must not be able to use up the database's commit
/// capacity or disk, while "why didn't it arrive?" still has examples of every reason.
///
/// `wrong_audience` with a valid signature is exempt: those tokens are genuine (nobody can forge
/// Apple's signature), they are deduplicated by `jti` at the database, and each one may be a
/// notification to replay once the configured bundle IDs are fixed.
package struct RejectionSampler: Sendable {
    package let limitPerMinute: Int
    private var windows: [RejectionReason: (minute: Int64, admitted: Int)] = [:]

    package init(limitPerMinute: Int) {
        self.limitPerMinute = limitPerMinute
    }

    /// The minute bucket of a time (floor, UTC).
    package static func minute(of date: Date) -> Date {
        Date(timeIntervalSince1970: (date.timeIntervalSince1970 / 60).rounded(.down) * 60)
    }

    /// True when this rejection gets a row.
    package mutating func admit(_ reason: RejectionReason, at date: Date, genuineToken: Bool) -> Bool {
        if genuineToken { return true }
        let minute = Int64((date.timeIntervalSince1970 / 60).rounded(.down))
        var window = windows[reason] ?? (minute, 0)
        if window.minute != minute { window = (minute, 0) }
        let admitted = window.admitted < limitPerMinute
        if admitted { window.admitted += 1 }
        windows[reason] = window
        return admitted
    }
}
