import Foundation

/// The revocation types a spike is watched for, each alone and both together.
package enum RevocationSeries {
    package static let types = [EventType.consentRevoked.rawValue, EventType.accountDelete.rawValue]
    package static let both = "revocations"
    /// Every series of one app's episode, in the order messages name them.
    package static let all = types + [both]

    /// `names` without duplicates, in the order of `all` (unknown names last, sorted).
    package static func ordered(_ names: some Sequence<String>) -> [String] {
        Set(names).sorted { (all.firstIndex(of: $0) ?? all.count, $0) < (all.firstIndex(of: $1) ?? all.count, $1) }
    }

    /// How messages name a series.
    package static func describe(_ name: String) -> String {
        name == both ? "revocations (consent-revoked + account-delete)" : name
    }
}

/// The spike rule's settings (`SIWA_SPIKE_*`).
package struct SpikeSettings: Sendable, Equatable {
    /// How often the detector evaluates.
    package var interval: Duration = .seconds(30)
    /// The window whose count is compared with the baseline.
    package var window: Duration = .seconds(300)
    /// A spike needs at least this many revocations in the window…
    package var minCount = 20
    /// …and at least this many times the baseline.
    package var factor = 5.0
    /// With no history for the app (less than a day), this many in the window fire on their own.
    package var newAppCount = 50
    /// A firing alert resolves once its series has been normal this long.
    package var resolveAfter: Duration = .seconds(900)

    package init() {}
}

/// Revocation spikes: the baseline is seasonal (the same time of day) and robust (a median).
///
/// For each of the 7 days before `now`, take the count in the hour centred on this time of day
/// (an hour rather than the window itself, so a quiet 5 minutes on one day is not a baseline of
/// zero), scale it to the window's length, and take the **median** over the days the app has
/// history for. A spike on one, two or three of those days leaves the median where it was; daily
/// and weekly rhythms are followed because each day is compared at the same hour. An app with no
/// history a day back (a new app) has no baseline and is held to an absolute count instead.
package enum SpikeRule {
    package static let historyDays = 7
    package static let neighbourhood: TimeInterval = 3600

    /// The ranges whose counts the rule needs at `now`: the window ending now, and the hour
    /// centred on this time of day on each of the 7 previous days (most recent first).
    package static func ranges(now: Date, window: Duration) -> (window: Range<Date>, days: [Range<Date>]) {
        let windowRange = now.addingTimeInterval(-window.timeInterval)..<now
        let days = (1...historyDays).map { day -> Range<Date> in
            let centre = now.addingTimeInterval(-Double(day) * 86_400 - window.timeInterval / 2)
            return centre.addingTimeInterval(-neighbourhood / 2)..<centre.addingTimeInterval(neighbourhood / 2)
        }
        return (windowRange, days)
    }

    /// The expected count in one window: the median over the days with history of that day's
    /// hour count scaled to the window. nil when no day has history (`firstSeen` after each
    /// day's hour began, or unknown): a new app.
    package static func baseline(dayCounts: [Int], days: [Range<Date>], firstSeen: Date?, window: Duration) -> Double? {
        guard let firstSeen else { return nil }
        let scale = window.timeInterval / neighbourhood
        let known = zip(dayCounts, days).filter { $0.1.lowerBound >= firstSeen }.map { Double($0.0) * scale }.sorted()
        guard !known.isEmpty else { return nil }
        let middle = known.count / 2
        return known.count % 2 == 1 ? known[middle] : (known[middle - 1] + known[middle]) / 2
    }

    /// Whether `count` in the window is a spike against `baseline` (nil: a new app).
    package static func observe(count: Int, baseline: Double?, settings: SpikeSettings) -> AlertObservation {
        guard let baseline else {
            return AlertObservation(value: count, baseline: nil, threshold: Double(settings.newAppCount), breaching: count >= settings.newAppCount)
        }
        let threshold = max(Double(settings.minCount), settings.factor * baseline)
        return AlertObservation(value: count, baseline: baseline, threshold: threshold, breaching: Double(count) >= threshold)
    }
}

/// Revocation counts of one app and type at one evaluation: the window's, and the hour around
/// this time of day on each of the 7 previous days (`SpikeRule.ranges`).
package struct SpikeCounts: Sendable, Equatable {
    package var aud: String
    package var type: String
    package var window: Int
    package var days: [Int]

    package init(aud: String, type: String, window: Int, days: [Int]) {
        self.aud = aud
        self.type = type
        self.window = window
        self.days = days
    }
}

/// What `revocation_spike` observes: the counts of the apps with any revocation in the window,
/// and when those apps were first heard from (absent: no history yet).
package struct RevocationCounts: Sendable, Equatable {
    package var spikes: [SpikeCounts]
    package var firstSeen: [String: Date]

    package init(spikes: [SpikeCounts] = [], firstSeen: [String: Date] = [:]) {
        self.spikes = spikes
        self.firstSeen = firstSeen
    }
}

/// `revocation_spike`: consent-revoked and/or account-delete far above their usual rate for an
/// app (`SpikeRule`'s arithmetic). An app's series (`consent-revoked`, `account-delete`,
/// `revocations`) are one episode (`AlertLifecycle.step(open:key:series:…)`): one burst pages
/// once, however many of them it crosses. Alerts stored before episodes (one row per series,
/// `type` set) still open are stepped alone until they resolve, and their series stay out of the
/// app's episode meanwhile, so an upgrade neither pages again for them nor leaves them open.
package struct RevocationSpikeRule: AlertRule {
    package let kind = AlertKind.revocationSpike
    package var settings: SpikeSettings

    package init(settings: SpikeSettings = SpikeSettings()) {
        self.settings = settings
    }

    package func step(_ observed: RevocationCounts, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let revocations = series(observed, now: now)
        let legacyOpen = open.filter { $0.key.type != nil }
        var legacy: [AlertKey: AlertObservation] = [:]
        for key in legacyOpen.map(\.key) {
            if let aud = key.aud, let type = key.type, let observation = revocations[aud]?[type] { legacy[key] = observation }
        }
        var decisions = AlertLifecycle.step(legacy, open: legacyOpen, now: now, resolveAfter: settings.resolveAfter)
        let episodes = Dictionary(open.filter { $0.key.type == nil }.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        for aud in Set(revocations.keys).union(episodes.keys.compactMap(\.aud)).sorted() {
            let key = AlertKey(kind: kind, aud: aud)
            let stepAlone = Set(legacyOpen.filter { $0.key.aud == aud }.compactMap(\.key.type))
            let series = (revocations[aud] ?? [:]).filter { !stepAlone.contains($0.key) }
            decisions.append(AlertLifecycle.step(open: episodes[key], key: key, series: series, now: now, resolveAfter: settings.resolveAfter))
        }
        return decisions
    }

    /// Each app's series (its types, and `revocations` for both) judged against its baseline.
    func series(_ observed: RevocationCounts, now: Date) -> [String: [String: AlertObservation]] {
        var revocations: [String: [String: AlertObservation]] = [:]
        let days = SpikeRule.ranges(now: now, window: settings.window).days
        for (aud, series) in Dictionary(grouping: observed.spikes, by: \.aud) {
            let both = SpikeCounts(
                aud: aud, type: RevocationSeries.both, window: series.map(\.window).reduce(0, +),
                days: (0..<SpikeRule.historyDays).map { day in series.map { $0.days[day] }.reduce(0, +) })
            for entry in series + [both] {
                let baseline = SpikeRule.baseline(dayCounts: entry.days, days: days, firstSeen: observed.firstSeen[aud], window: settings.window)
                revocations[aud, default: [:]][entry.type] = SpikeRule.observe(count: entry.window, baseline: baseline, settings: settings)
            }
        }
        return revocations
    }

    package func subject(_ message: AlertMessage) -> String {
        let episode = message.episode
        let what = message.series.isEmpty ? "revocations" : message.series.map(RevocationSeries.describe).joined(separator: ", ")
        let versus = episode.baseline.map { String(format: "usually %.1f", $0) } ?? "no history yet"
        let ratio = episode.ratio.map { String(format: ", %.1f×", $0) } ?? ""
        return "\(what) for \(episode.key.aud ?? "every app"): \(episode.peak) in \(DurationSyntax.format(message.window)) (\(versus)\(ratio))"
    }
}
