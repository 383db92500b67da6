import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// Evaluates the alerts every `SIWA_SPIKE_INTERVAL`: revocation spikes per app and type, one
/// episode per app (the counts come from the rollup, the arithmetic from `SpikeRule`), jobs
/// discarded, queue lag, bad signatures, Apple's refusals and app transfers' deadlines
/// (`TransferDeadlineRule`). One process evaluates at a time, whoever holds the `alerts` lease
/// (a row, so no connection is held for it); it renews the lease each round and gives it up on
/// shutdown, and another process takes over once it expires. Firing, updated and resolved alerts
/// are logged here and queued for the sinks (lane `alerts`, delivered by a `Deliverer`).
package final class AlertMonitor: Service, Sendable {
    package struct Configuration: Sendable {
        package var spike = SpikeSettings()
        /// queue_lag fires when the oldest ready job has waited this long.
        package var queueLag: Duration = .seconds(120)
        /// bad_signatures fires at this many in the spike window.
        package var badSignatures = 20
        /// jobs_discarded fires at this many discards in the spike window (alert deliveries excepted).
        package var discardedJobs = 1
        package var transferDeadline = TransferDeadlineSettings()
        /// endpoint_unhealthy: the URL whose stored check is judged, and the certificate's days.
        package var endpoint = EndpointHealthSettings()
        package var sinks = AlertSinks()

        package init() {}
    }

    package static let leaseName = "alerts"

    /// What one round did.
    package enum AlertRound: Sendable {
        /// Another process holds the `alerts` lease: it evaluates.
        case notHolder
        /// This process holds the lease and evaluated; what fired, joined and resolved.
        case evaluated([AlertDecision])
    }

    package let configuration: Configuration
    let store: AlertStore
    let logger: Logger
    let identity: String
    let metrics: AlertMetrics?

    package init(configuration: Configuration, store: AlertStore, logger: Logger, identity: String, metrics: AlertMetrics? = nil) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
        self.identity = identity
        self.metrics = metrics
    }

    package func run() async throws {
        let interval = configuration.spike.interval
        // Abandoned on shutdown, so a statement that never answers cannot hold SIGTERM.
        await Scheduler.run(.periodic(every: interval, retryAfter: interval), once: { try await self.runOnce(now: Date()) }) { error in
            logger.warning("alert evaluation failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
        let (store, identity) = (self.store, self.identity)
        _ = try? await withDeadline(.seconds(5)) { try await store.release(lease: Self.leaseName, holder: identity) }
    }

    /// One round at `now`: evaluates if this process holds (or takes) the `alerts` lease, judged at
    /// `leaseNow` (nil: PostgreSQL's time, which every process shares; tests pass theirs).
    @discardableResult
    package func runOnce(now: Date, leaseNow: Date? = nil) async throws -> AlertRound {
        guard try await store.acquire(lease: Self.leaseName, holder: identity, ttl: configuration.spike.interval * 3 + .seconds(5), now: leaseNow) else {
            return .notHolder
        }
        return .evaluated(try await evaluate(now: now))
    }

    /// One evaluation of every series at `now`; returns what fired, joined and resolved.
    ///
    /// An app's revocation series (`consent-revoked`, `account-delete`, `revocations`) are one
    /// episode (`AlertLifecycle.step(open:key:series:…)`): one burst pages once, however many of
    /// them it crosses. Alerts stored before episodes (one row per series, `type` set) still open
    /// are stepped alone until they resolve, and their series stay out of the app's episode
    /// meanwhile, so an upgrade neither pages again for them nor leaves them open.
    @discardableResult
    package func evaluate(now: Date) async throws -> [AlertDecision] {
        let settings = configuration.spike
        // One-series alerts by key (operational, and old per-series revocation rows still open);
        // revocation series by app, then type.
        var observations: [AlertKey: AlertObservation] = [:]
        var revocations: [String: [String: AlertObservation]] = [:]

        let counts = try await store.spikeCounts(now: now, window: settings.window)
        let firstSeen = try await store.firstSeen(auds: Array(Set(counts.map(\.aud))))
        let days = SpikeRule.ranges(now: now, window: settings.window).days
        for (aud, series) in Dictionary(grouping: counts, by: \.aud) {
            let both = SpikeCounts(
                aud: aud, type: RevocationSeries.both, window: series.map(\.window).reduce(0, +),
                days: (0..<SpikeRule.historyDays).map { day in series.map { $0.days[day] }.reduce(0, +) })
            for entry in series + [both] {
                let baseline = SpikeRule.baseline(dayCounts: entry.days, days: days, firstSeen: firstSeen[aud], window: settings.window)
                revocations[aud, default: [:]][entry.type] = SpikeRule.observe(count: entry.window, baseline: baseline, settings: settings)
            }
        }
        let signals = try await store.operationalSignals(since: now.addingTimeInterval(-settings.window.timeInterval), now: now)
        observations[AlertKey(kind: .queueLag)] = .atLeast(Int(configuration.queueLag.timeInterval), value: signals.queueLag)
        observations[AlertKey(kind: .jobsDiscarded)] = .atLeast(configuration.discardedJobs, value: signals.discarded)
        observations[AlertKey(kind: .badSignatures)] = .atLeast(configuration.badSignatures, value: signals.badSignatures)
        observations[AlertKey(kind: .appleCredentials)] = .atLeast(1, value: signals.appleInvalidClient)
        if let url = configuration.endpoint.url, let report = try await EndpointCheckStore(client: store.client, logger: logger).latest(url: url.absoluteString),
            let endpoint = EndpointHealthRule.observe(report, now: now, certificateDays: configuration.endpoint.certificateDays)
        { observations[endpoint.key] = endpoint.observation }
        if let metrics {
            metrics.record(signals: signals)
            metrics.record(depth: try await store.queueDepth())
        }

        let open = try await store.open()
        let openByKey = Dictionary(open.map { ($0.episode.key, $0) }, uniquingKeysWith: { first, _ in first })
        // Old per-series rows: each is its own series' observation.
        for key in openByKey.keys where key.kind == .revocationSpike && key.type != nil {
            if let aud = key.aud, let type = key.type, let observation = revocations[aud]?[type] { observations[key] = observation }
        }
        var steps: [(key: AlertKey, decision: AlertDecision)] = []
        let oneSeries = openByKey.keys.filter { ($0.kind != .revocationSpike || $0.type != nil) && $0.kind != .transferDeadline }
        for key in Set(observations.keys).union(oneSeries).sorted(by: { $0.description < $1.description }) {
            let record = openByKey[key]
            // A series with an open episode and nothing counted this round is quiet: not breaching.
            let observation = observations[key] ?? AlertObservation(value: 0, baseline: nil, threshold: record?.episode.threshold ?? 0, breaching: false)
            steps.append((key, AlertLifecycle.step(open: record?.episode, key: key, observation: observation, now: now, resolveAfter: settings.resolveAfter)))
        }
        let episodeAuds = Set(revocations.keys).union(openByKey.keys.filter { $0.kind == .revocationSpike && $0.type == nil }.compactMap(\.aud))
        for aud in episodeAuds.sorted() {
            let key = AlertKey(kind: .revocationSpike, aud: aud)
            let legacy = Set(openByKey.keys.filter { $0.kind == .revocationSpike && $0.aud == aud }.compactMap(\.type))
            let series = (revocations[aud] ?? [:]).filter { !legacy.contains($0.key) }
            steps.append((key, AlertLifecycle.step(open: openByKey[key]?.episode, key: key, series: series, now: now, resolveAfter: settings.resolveAfter)))
        }
        var backlogs: [AlertKey: TransferBacklog] = [:]
        for (transfer, left) in try await TransferStore(client: store.client, logger: logger).backlogs(now: now) {
            let key = TransferDeadlineRule.key(aud: transfer.aud, outgoing: transfer.direction == .outgoing, team: transfer.teamID)
            backlogs[key] = TransferBacklog(key: key, window: TransferWindow(transferredAt: transfer.transferredAt), usersLeft: left)
        }
        metrics?.record(transfers: backlogs.values.filter { $0.window.isOpen(at: now) })
        for key in Set(backlogs.keys).union(openByKey.keys.filter { $0.kind == .transferDeadline }).sorted(by: { $0.description < $1.description }) {
            steps.append(
                (key, TransferDeadlineRule.step(open: openByKey[key]?.episode, key: key, backlog: backlogs[key], now: now, settings: configuration.transferDeadline)))
        }

        var decisions: [AlertDecision] = []
        var firing = Set(openByKey.keys)
        for (key, decision) in steps {
            let record = openByKey[key]
            switch decision {
            case .none:
                break
            case .fire(let episode):
                // nil: another evaluator opened this episode first; it is firing either way.
                firing.insert(key)
                if let fired = try await store.fire(episode, window: settings.window, sinks: configuration.sinks.messages) {
                    log(fired.message, silenced: fired.silencedBy != nil)
                    decisions.append(decision)
                }
            case .update(let episode):
                if let record { try await store.update(record.id, episode) }
            case .join(let episode, let joined):
                if var record {
                    record.episode = episode
                    let outcome = try await store.join(record, joined: joined, sinks: configuration.sinks.messages)
                    if outcome != .alreadyJoined {
                        log(AlertMessage(id: record.id, episode: episode, window: record.window, resolvedAt: nil, joined: joined), silenced: outcome == .silenced)
                        decisions.append(decision)
                    }
                }
            case .resolve(let episode, let at):
                if var record {
                    record.episode = episode
                    try await store.resolve(record, at: at, sinks: configuration.sinks.messages)
                    var message = record.message
                    message.resolvedAt = at
                    log(message, silenced: record.silencedBy != nil)
                    decisions.append(decision)
                    firing.remove(key)
                }
            }
        }
        metrics?.record(firing: Array(firing))
        return decisions
    }

    /// The log sink: one line per firing, update and resolution, always.
    private func log(_ message: AlertMessage, silenced: Bool) {
        let key = message.episode.key
        var metadata: Logger.Metadata = [
            "alert_id": "\(message.id)", "kind": "\(key.kind.rawValue)", "state": "\(message.state.rawValue)", "count": "\(message.episode.peak)",
            "threshold": "\(Int(message.episode.threshold.rounded()))", "window": "\(DurationSyntax.format(message.window))",
        ]
        if let aud = key.aud { metadata["aud"] = "\(aud)" }
        if let type = key.type { metadata["type"] = "\(type)" }
        if !message.episode.series.isEmpty { metadata["series"] = "\(message.episode.series.joined(separator: ","))" }
        if !message.joined.isEmpty { metadata["joined"] = "\(message.joined.joined(separator: ","))" }
        if let baseline = message.episode.baseline { metadata["baseline"] = "\(String(format: "%.2f", baseline))" }
        if let ratio = message.episode.ratio { metadata["ratio"] = "\(String(format: "%.2f", ratio))" }
        if silenced { metadata["silenced"] = "true" }
        switch message.state {
        case .firing, .updated: logger.warning("alert: \(message.text)", metadata: metadata)
        case .resolved: logger.notice("alert: \(message.text)", metadata: metadata)
        }
    }
}
