import Foundation

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

/// What the operational alerts watch, per evaluation window.
package struct OperationalSignals: Sendable, Equatable {
    /// Seconds the oldest ready job (any lane) has waited.
    package var queueLag = 0
    /// Jobs discarded in the window, by lane (each lane its own `jobs_discarded` series).
    package var discardedByLane: [String: Int] = [:]
    /// Jobs discarded in the window, every lane.
    package var discarded: Int { discardedByLane.values.reduce(0, +) }
    /// Deliveries refused for a bad signature or an unknown key in the window.
    package var badSignatures = 0
    /// Calls Apple refused with `invalid_client` in the window.
    package var appleInvalidClient = 0

    package init(queueLag: Int = 0, discardedByLane: [String: Int] = [:], badSignatures: Int = 0, appleInvalidClient: Int = 0) {
        self.queueLag = queueLag
        self.discardedByLane = discardedByLane
        self.badSignatures = badSignatures
        self.appleInvalidClient = appleInvalidClient
    }
}

/// Everything one alert evaluation reads; `AlertMonitor` gathers it, `AlertRules.decide` judges it.
package struct AlertObservations: Sendable, Equatable {
    /// Revocation counts of the apps with any in the window.
    package var spikes: [SpikeCounts] = []
    /// When those apps were first heard from (absent: no history yet).
    package var firstSeen: [String: Date] = [:]
    package var signals = OperationalSignals()
    /// Every app transfer whose window is open.
    package var transfers: [TransferBacklog] = []
    /// Every watched app, for `quiet_app`.
    package var apps: [AppActivity] = []
    /// The latest check of the endpoint registered with Apple (nil: none, or no `SIWA_PUBLIC_URL`).
    package var endpoint: EndpointReport?

    package init() {}
}

/// The rules' settings (`SIWA_SPIKE_*`, `SIWA_ALERT_*`).
package struct AlertRuleSettings: Sendable, Equatable {
    package var spike = SpikeSettings()
    /// queue_lag fires when the oldest ready job has waited this long.
    package var queueLag: Duration = .seconds(120)
    /// bad_signatures fires at this many in the spike window.
    package var badSignatures = 20
    /// jobs_discarded fires at this many discards of one lane in the spike window.
    package var discardedJobs = 1
    package var transferDeadline = TransferDeadlineSettings()
    package var quiet = QuietSettings()
    /// endpoint_unhealthy: the URL checked (`SIWA_PUBLIC_URL`) and the certificate's days.
    package var endpoint = EndpointHealthSettings()

    package init() {}
}

/// Every alert rule as one pure function: observations, the open episodes and the time in, one
/// decision per series out. The monitor reads, calls this, and writes what it says.
package enum AlertRules {
    /// The decisions at `now` (none for a series with nothing to do), in the order of their keys.
    ///
    /// An app's revocation series (`consent-revoked`, `account-delete`, `revocations`) are one
    /// episode (`AlertLifecycle.step(open:key:series:…)`): one burst pages once, however many of
    /// them it crosses. Alerts stored before episodes (one row per series, `type` set) still open
    /// are stepped alone until they resolve, and their series stay out of the app's episode
    /// meanwhile, so an upgrade neither pages again for them nor leaves them open.
    package static func decide(_ observed: AlertObservations, open: [AlertEpisode], now: Date, settings: AlertRuleSettings) -> [AlertDecision] {
        let spike = settings.spike
        let openByKey = Dictionary(open.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        var steps: [(key: AlertKey, decision: AlertDecision)] = []

        // Revocation series by app, then type.
        var revocations: [String: [String: AlertObservation]] = [:]
        let days = SpikeRule.ranges(now: now, window: spike.window).days
        for (aud, series) in Dictionary(grouping: observed.spikes, by: \.aud) {
            let both = SpikeCounts(
                aud: aud, type: RevocationSeries.both, window: series.map(\.window).reduce(0, +),
                days: (0..<SpikeRule.historyDays).map { day in series.map { $0.days[day] }.reduce(0, +) })
            for entry in series + [both] {
                let baseline = SpikeRule.baseline(dayCounts: entry.days, days: days, firstSeen: observed.firstSeen[aud], window: spike.window)
                revocations[aud, default: [:]][entry.type] = SpikeRule.observe(count: entry.window, baseline: baseline, settings: spike)
            }
        }

        // One-series alerts: operational, and old per-series revocation rows still open.
        let signals = observed.signals
        var observations: [AlertKey: AlertObservation] = [
            AlertKey(kind: .queueLag): .atLeast(Int(settings.queueLag.timeInterval), value: signals.queueLag),
            AlertKey(kind: .badSignatures): .atLeast(settings.badSignatures, value: signals.badSignatures),
            AlertKey(kind: .appleCredentials): .atLeast(1, value: signals.appleInvalidClient),
        ]
        // One series per lane: the alert names the lane, and so what to run.
        for (lane, count) in signals.discardedByLane where count > 0 {
            observations[AlertKey(kind: .jobsDiscarded, type: lane)] = .atLeast(settings.discardedJobs, value: count)
        }
        if let report = observed.endpoint, let endpoint = EndpointHealthRule.observe(report, now: now, certificateDays: settings.endpoint.certificateDays) {
            observations[endpoint.key] = endpoint.observation
        }
        for key in openByKey.keys where key.kind == .revocationSpike && key.type != nil {
            if let aud = key.aud, let type = key.type, let observation = revocations[aud]?[type] { observations[key] = observation }
        }
        let stepped: Set<AlertKind> = [.revocationSpike, .transferDeadline, .quietApp]
        let oneSeries = openByKey.keys.filter { !stepped.contains($0.kind) || ($0.kind == .revocationSpike && $0.type != nil) }
        for key in Set(observations.keys).union(oneSeries).sorted(by: { $0.description < $1.description }) {
            let record = openByKey[key]
            // A series with an open episode and nothing counted this round is quiet: not breaching.
            let observation = observations[key] ?? AlertObservation(value: 0, baseline: nil, threshold: record?.threshold ?? 0, breaching: false)
            steps.append((key, AlertLifecycle.step(open: record, key: key, observation: observation, now: now, resolveAfter: spike.resolveAfter)))
        }

        // Revocation episodes, one per app.
        let episodeAuds = Set(revocations.keys).union(openByKey.keys.filter { $0.kind == .revocationSpike && $0.type == nil }.compactMap(\.aud))
        for aud in episodeAuds.sorted() {
            let key = AlertKey(kind: .revocationSpike, aud: aud)
            let legacy = Set(openByKey.keys.filter { $0.kind == .revocationSpike && $0.aud == aud }.compactMap(\.type))
            let series = (revocations[aud] ?? [:]).filter { !legacy.contains($0.key) }
            steps.append((key, AlertLifecycle.step(open: openByKey[key], key: key, series: series, now: now, resolveAfter: spike.resolveAfter)))
        }

        // App transfers' deadlines.
        let backlogs = Dictionary(observed.transfers.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        for key in Set(backlogs.keys).union(openByKey.keys.filter { $0.kind == .transferDeadline }).sorted(by: { $0.description < $1.description }) {
            steps.append(
                (key, TransferDeadlineRule.step(open: openByKey[key], key: key, backlog: backlogs[key], now: now, settings: settings.transferDeadline)))
        }

        // Quiet apps.
        let apps = Dictionary(observed.apps.map { (AlertKey(kind: .quietApp, aud: $0.aud), $0) }, uniquingKeysWith: { first, _ in first })
        for key in Set(apps.keys).union(openByKey.keys.filter { $0.kind == .quietApp }).sorted(by: { $0.description < $1.description }) {
            steps.append((key, QuietRule.step(open: openByKey[key], key: key, activity: apps[key], now: now, settings: settings.quiet)))
        }

        return steps.map(\.decision).filter { $0 != .none }
    }
}
