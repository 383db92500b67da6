import Foundation

/// When `quiet_app` fires (`SIWA_ALERT_QUIET_*`).
package struct QuietSettings: Sendable, Equatable {
    /// Fire when a gap this long had at most a 1-in-`odds` chance under the app's history.
    package var odds = 100_000.0
    /// An app with less history than this has no baseline: it is never quiet.
    package var minimumHistory: Duration = .seconds(7 * 86_400)
    /// However busy the app, a gap shorter than this never fires (the floor).
    package var minimumGap: Duration = .seconds(3600)

    package init() {}
}

/// One app's arrivals as the quiet rule reads them: when it was first and last heard from, and in
/// which 10-minute spans of its recent history something arrived, by hour of the week.
package struct AppActivity: Sendable, Equatable {
    package var aud: String
    package var firstSeen: Date
    /// The last genuine notification (accepted, any type); rejections do not count.
    package var lastArrival: Date
    /// The history read: `QuietRule.historyWeeks` weeks up to the start of the current hour.
    package var history: Range<Date>
    /// Hour of the week (0: Monday 00:00 UTC … 167) → 10-minute spans in `history` with an arrival.
    package var activeSpans: [Int: Int]
    /// Deliveries rejected since `lastArrival`, by reason (the endpoint is reached, the app is not).
    package var rejectedSince: [String: Int]

    package init(aud: String, firstSeen: Date, lastArrival: Date, history: Range<Date>, activeSpans: [Int: Int], rejectedSince: [String: Int] = [:]) {
        self.aud = aud
        self.firstSeen = firstSeen
        self.lastArrival = lastArrival
        self.history = history
        self.activeSpans = activeSpans
        self.rejectedSince = rejectedSince
    }
}

/// The `quiet_app` rule, pure. Time is cut into 10-minute spans; for each hour of the week the
/// app's history gives the share of its spans with at least one arrival (smoothed towards the
/// app's overall share, so never 0 or 1). Taking spans as independent, the chance of the current gap is the product of
/// each span's chance of being empty; it fires when that chance is below 1 in `odds` and the gap
/// is at least `minimumGap`. Counting spans rather than arrivals keeps bursts from looking like a
/// steady rate: a burst of 50 fills one span, not 50. The episode starts at the last arrival and
/// resolves at the next genuine one. It observes every watched app's arrivals.
package struct QuietRule: AlertRule {
    package let kind = AlertKind.quietApp
    package var settings: QuietSettings

    package init(settings: QuietSettings = QuietSettings()) {
        self.settings = settings
    }

    /// Each app observed or open, in key order (an app no longer observed resolves).
    package func step(_ apps: [AppActivity], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let byKey = Dictionary(apps.map { (AlertKey(kind: kind, aud: $0.aud), $0) }, uniquingKeysWith: { first, _ in first })
        let openByKey = Dictionary(open.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        return Set(byKey.keys).union(openByKey.keys).sorted { $0.description < $1.description }.map { key in
            Self.step(open: openByKey[key], key: key, activity: byKey[key], now: now, settings: settings)
        }
    }

    /// The episode's `count` is the minutes without an arrival, `baseline` the 10-minute spans
    /// that usually have one in that time, `threshold` the odds, `series` the rejection reasons
    /// meanwhile.
    package func subject(_ message: AlertMessage) -> String {
        let episode = message.episode
        let digits = String(Int(episode.threshold))
        let odds = digits.enumerated().map { index, digit in (index > 0 && (digits.count - index) % 3 == 0 ? "," : "") + String(digit) }.joined()
        let rejected =
            message.series.isEmpty ? "" : "; deliveries were rejected meanwhile (\(message.series.joined(separator: ", "))): `siwa-events rejections list`"
        return "nothing has arrived for \(episode.key.aud ?? "an app") for \(Self.minutes(episode.peak)); its history has arrivals in "
            + "about \(Int((episode.baseline ?? 0).rounded())) of that time's 10-minute spans (chance of such a gap under 1 in \(odds))\(rejected)"
    }

    /// "6 h 10 m" for 370 minutes.
    static func minutes(_ minutes: Int) -> String {
        minutes < 60 ? "\(minutes) m" : minutes % 60 == 0 ? "\(minutes / 60) h" : "\(minutes / 60) h \(minutes % 60) m"
    }

    package static let span: TimeInterval = 600
    package static let historyWeeks = 4

    /// Hour of the week of `date` in UTC: 0 is Monday 00:00.
    package static func hourOfWeek(_ date: Date) -> Int {
        let hours = Int((date.timeIntervalSince1970 / 3600).rounded(.down))
        // 1970-01-01 was a Thursday: hour 0 of the epoch is hour 72 of its week.
        return ((hours + 72) % 168 + 168) % 168
    }

    /// The history window at `now`: `historyWeeks` weeks up to the start of the current hour, from
    /// the app's first arrival at the earliest.
    package static func history(now: Date, firstSeen: Date) -> Range<Date> {
        let end = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / 3600).rounded(.down) * 3600)
        let start = max(end.addingTimeInterval(-Double(historyWeeks) * 7 * 86_400), min(firstSeen, end))
        return start..<end
    }

    /// Weight, in spans, of the app's overall rate in each hour's estimate (an hour's worth): an
    /// hour of the week seen empty four times is not taken as certain to stay empty.
    static let prior = 6.0

    /// Per hour of the week, the chance that one of its 10-minute spans is empty: the hour's own
    /// share of empty spans, pulled towards the app's overall share (itself kept off 0 and 1), so
    /// no hour is ever certain.
    static func emptyChances(_ activity: AppActivity) -> [Double] {
        var spans = [Int](repeating: 0, count: 168)
        var hour = activity.history.lowerBound
        while hour < activity.history.upperBound {
            let next = min(activity.history.upperBound, Date(timeIntervalSince1970: ((hour.timeIntervalSince1970 / 3600).rounded(.down) + 1) * 3600))
            spans[hourOfWeek(hour)] += Int((next.timeIntervalSince(hour) / span).rounded(.down))
            hour = next
        }
        let active = (0..<168).map { min(activity.activeSpans[$0] ?? 0, spans[$0]) }
        let total = spans.reduce(0, +)
        let overall = Double(total - active.reduce(0, +) + 1) / Double(total + 2)
        return (0..<168).map { slot in (Double(spans[slot] - active[slot]) + prior * overall) / (Double(spans[slot]) + prior) }
    }

    /// log10 of the chance of no arrival over `gap`, and the spans with an arrival expected in
    /// it, under `activity`'s history.
    package static func chance(of gap: Range<Date>, under activity: AppActivity) -> (log10: Double, expectedSpans: Double) {
        let empty = emptyChances(activity)
        var (logChance, expected) = (0.0, 0.0)
        var at = gap.lowerBound
        while at < gap.upperBound {
            let next = min(gap.upperBound, Date(timeIntervalSince1970: ((at.timeIntervalSince1970 / span).rounded(.down) + 1) * span))
            let share = next.timeIntervalSince(at) / span
            let q = empty[hourOfWeek(at)]
            logChance += share * log10(q)
            expected += share * (1 - q)
            at = next
        }
        return (logChance, expected)
    }

    /// One evaluation of one app at `now`; `activity` nil when the app is no longer watched.
    package static func step(open: AlertEpisode?, key: AlertKey, activity: AppActivity?, now: Date, settings: QuietSettings) -> AlertDecision {
        let reasons = activity.map { $0.rejectedSince.filter { $0.value > 0 }.keys.sorted() } ?? []
        if var episode = open {
            guard let activity, activity.lastArrival <= episode.startedAt else { return .resolve(episode, at: now) }
            let (_, expected) = chance(of: activity.lastArrival..<now, under: activity)
            episode.value = Int(now.timeIntervalSince(activity.lastArrival) / 60)
            episode.peak = max(episode.peak, episode.value)
            episode.baseline = (expected * 10).rounded() / 10
            episode.series = reasons
            return episode == open ? .none : .update(episode)
        }
        guard let activity, now.timeIntervalSince(activity.firstSeen) >= settings.minimumHistory.timeInterval,
            now.timeIntervalSince(activity.lastArrival) >= settings.minimumGap.timeInterval
        else { return .none }
        let (logChance, expected) = chance(of: activity.lastArrival..<now, under: activity)
        guard logChance <= -log10(settings.odds) else { return .none }
        let minutes = Int(now.timeIntervalSince(activity.lastArrival) / 60)
        return .fire(
            AlertEpisode(
                key: key, series: reasons, startedAt: activity.lastArrival, value: minutes, peak: minutes, baseline: (expected * 10).rounded() / 10,
                threshold: settings.odds))
    }
}
