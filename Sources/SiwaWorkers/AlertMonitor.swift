import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore
import Synchronization

/// Evaluates the alerts every `SIWA_SPIKE_INTERVAL`: revocation spikes per app and type, one
/// episode per app (the counts come from the rollup, the arithmetic from `SpikeRule`), jobs
/// discarded, queue lag, bad signatures, Apple's refusals and app transfers' deadlines
/// (`TransferDeadlineRule`). One process evaluates at a time, whoever holds the `alerts` lease
/// (a row, so no connection is held for it); it renews the lease each round and gives it up on
/// shutdown, and another process takes over once it expires. Firing, updated and resolved alerts
/// are logged here and queued for the sinks (lane `alerts`, delivered by a `Deliverer`).
package final class AlertMonitor: Service, Sendable {
    package struct Configuration: Sendable {
        package var rules = AlertRuleSettings()
        /// The endpoint check's settings (`rules.endpoint`), which the checker reads too.
        package var endpoint: EndpointHealthSettings {
            get { rules.endpoint }
            set { rules.endpoint = newValue }
        }
        package var sinks = AlertSinks()
        /// The apps watched for quiet_app (the configured bundle IDs); empty: every app heard from.
        package var apps: [String] = []

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
    /// `quiet_app`'s history spans, by the end of the history they were read for.
    private let history = Mutex<(end: Date, spans: [String: [Int: Int]])?>(nil)

    package init(configuration: Configuration, store: AlertStore, logger: Logger, identity: String, metrics: AlertMetrics? = nil) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
        self.identity = identity
        self.metrics = metrics
    }

    package func run() async throws {
        let interval = configuration.rules.spike.interval
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
        guard try await store.acquire(lease: Self.leaseName, holder: identity, ttl: configuration.rules.spike.interval * 3 + .seconds(5), now: leaseNow) else {
            return .notHolder
        }
        return .evaluated(try await evaluate(now: now))
    }

    /// One evaluation of every series at `now`: reads what the rules watch, asks
    /// `AlertRules.decide`, writes and tells what it decided; returns what fired, joined and
    /// resolved.
    @discardableResult
    package func evaluate(now: Date) async throws -> [AlertDecision] {
        let observed = try await observe(now: now)
        let open = try await store.open()
        return try await apply(AlertRules.decide(observed, open: open.map(\.episode), now: now, settings: configuration.rules), open: open)
    }

    /// What `evaluate` would decide at `now`, written nowhere (`alerts evaluate --dry-run`).
    package func preview(now: Date) async throws -> [AlertDecision] {
        AlertRules.decide(try await observe(now: now), open: try await store.open().map(\.episode), now: now, settings: configuration.rules)
    }

    /// Everything the rules watch at `now` (and the evaluator's gauges, set as it reads).
    private func observe(now: Date) async throws -> AlertObservations {
        let settings = configuration.rules
        var observed = AlertObservations()
        observed.spikes = try await store.spikeCounts(now: now, window: settings.spike.window)
        observed.firstSeen = try await store.firstSeen(auds: Array(Set(observed.spikes.map(\.aud))))
        observed.signals = try await store.operationalSignals(since: now.addingTimeInterval(-settings.spike.window.timeInterval), now: now)
        for (transfer, left) in try await TransferStore(client: store.client, logger: logger).backlogs(now: now) {
            let key = TransferDeadlineRule.key(aud: transfer.aud, outgoing: transfer.direction == .outgoing, team: transfer.teamID)
            observed.transfers.append(TransferBacklog(key: key, window: TransferWindow(transferredAt: transfer.transferredAt), usersLeft: left))
        }
        observed.apps = try await appActivity(now: now)
        if let url = configuration.endpoint.url {
            observed.endpoint = try await EndpointCheckStore(client: store.client, logger: logger).latest(url: url.absoluteString)
        }
        if let metrics {
            metrics.record(signals: observed.signals)
            metrics.record(depth: try await store.queueDepth())
            metrics.record(transfers: observed.transfers.filter { $0.window.isOpen(at: now) })
        }
        return observed
    }

    /// Writes and tells what the rules decided about the `open` records; returns what was told.
    private func apply(_ decided: [AlertDecision], open: [AlertRecord]) async throws -> [AlertDecision] {
        let window = configuration.rules.spike.window
        let openByKey = Dictionary(open.map { ($0.episode.key, $0) }, uniquingKeysWith: { first, _ in first })
        var decisions: [AlertDecision] = []
        var firing = Set(openByKey.keys)
        for decision in decided {
            guard let key = decision.episode?.key else { continue }
            let record = openByKey[key]
            switch decision {
            case .none:
                break
            case .fire(let episode):
                // nil: another evaluator opened this episode first; it is firing either way.
                firing.insert(key)
                if let fired = try await store.fire(episode, window: window, sinks: configuration.sinks.messages) {
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

    /// Every watched app's arrivals for `quiet_app`: the history spans are read once an hour
    /// (they only change when it turns), the last arrival and the rejections since it each round.
    private func appActivity(now: Date) async throws -> [AppActivity] {
        let arrivals = try await store.arrivals(auds: configuration.apps)
        guard !arrivals.isEmpty else { return [] }
        let window = QuietRule.history(now: now, firstSeen: .distantPast)
        let cached = history.withLock { $0?.end == window.upperBound ? $0?.spans : nil }
        let spans: [String: [Int: Int]]
        if let cached {
            spans = cached
        } else {
            spans = try await store.activeSpans(auds: arrivals.map(\.aud), history: window)
            history.withLock { $0 = (window.upperBound, spans) }
        }
        let quiet = configuration.rules.quiet
        var apps: [AppActivity] = []
        for arrival in arrivals {
            var activity = AppActivity(
                aud: arrival.aud, firstSeen: arrival.firstSeen, lastArrival: arrival.lastArrival,
                history: QuietRule.history(now: now, firstSeen: arrival.firstSeen), activeSpans: spans[arrival.aud] ?? [:])
            // Rejections matter only to a gap long enough to fire (they name why it is quiet).
            if now.timeIntervalSince(arrival.lastArrival) >= quiet.minimumGap.timeInterval {
                activity.rejectedSince = try await store.rejections(since: arrival.lastArrival)
            }
            apps.append(activity)
        }
        return apps
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
