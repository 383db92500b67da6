import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// Evaluates the alert rules every `SIWA_SPIKE_INTERVAL`: each registered rule
/// (`Configuration.registered`: the built-in ones, then any declared) observes what it watches,
/// `AlertRules.decide` steps them all, and the monitor writes what they decided. One process
/// evaluates at a time, whoever holds the `alerts` lease (a row, so no connection is held for
/// it); it renews the lease each round and gives it up on shutdown, and another process takes
/// over once it expires. Firing, updated and resolved alerts are logged here, in their rule's
/// words, and queued for the sinks (lane `alerts`, delivered by a `Deliverer`).
package final class AlertMonitor: Service, Sendable {
    package struct Configuration: Sendable {
        /// The built-in rules' settings (`SIWA_SPIKE_*`, `SIWA_ALERT_*`).
        package var rules = AlertRuleSettings()
        /// The endpoint check's settings (`rules.endpoint`), which the checker reads too.
        package var endpoint: EndpointHealthSettings {
            get { rules.endpoint }
            set { rules.endpoint = newValue }
        }
        package var sinks = AlertSinks()
        /// The apps watched for quiet_app (the configured bundle IDs); empty: every app heard from.
        package var apps: [String] = []
        /// Rules declared besides the built-in ones (a test's), evaluated after them; each owns a
        /// kind no other rule has.
        package var declared: [any MonitoredAlertRule] = []

        /// Every rule the monitor evaluates, in order: the built-in ones, then `declared`.
        package var registered: [any MonitoredAlertRule] { rules.builtInRules(apps: apps) + declared }

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
    /// The rules evaluated each round (`configuration.registered`, made once: a rule may keep
    /// what it read, as `quiet_app` keeps its hourly history).
    let rules: [any MonitoredAlertRule]
    let store: AlertStore
    let leases: LeaseStore
    let source: AlertSource
    let logger: Logger
    let identity: String
    let metrics: AlertMetrics?

    package init(configuration: Configuration, store: AlertStore, logger: Logger, identity: String, metrics: AlertMetrics? = nil) {
        self.configuration = configuration
        rules = configuration.registered
        precondition(Set(rules.map(\.kind)).count == rules.count, "each alert kind has one rule: \(rules.map(\.kind))")
        self.store = store
        leases = LeaseStore(client: store.client, logger: logger)
        source = AlertSource(client: store.client, logger: logger, window: configuration.rules.spike.window, metrics: metrics)
        self.logger = logger
        self.identity = identity
        self.metrics = metrics
    }

    package func run() async throws {
        let interval = configuration.rules.spike.interval
        // Abandoned on shutdown, so a statement that never answers cannot hold SIGTERM.
        await Scheduler.run(.periodic(every: interval, retryAfter: interval, phase: Phase.alerts), once: { try await self.runOnce(now: Date()) }) { error in
            logger.warning("alert evaluation failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
        let (leases, identity) = (self.leases, self.identity)
        _ = try? await withDeadline(.seconds(5)) { try await leases.release(lease: Self.leaseName, holder: identity) }
    }

    /// One round at `now`: evaluates if this process holds (or takes) the `alerts` lease, judged at
    /// `leaseNow` (nil: PostgreSQL's time, which every process shares; tests pass theirs).
    @discardableResult
    package func runOnce(now: Date, leaseNow: Date? = nil) async throws -> AlertRound {
        guard try await leases.acquire(lease: Self.leaseName, holder: identity, ttl: configuration.rules.spike.interval * 3 + .seconds(5), now: leaseNow) else {
            return .notHolder
        }
        return .evaluated(try await evaluate(now: now))
    }

    /// One evaluation of every rule at `now`: each observes what it watches, `AlertRules.decide`
    /// steps them, and what they decided is written and told; returns what fired, joined and
    /// resolved.
    @discardableResult
    package func evaluate(now: Date) async throws -> [AlertDecision] {
        let (observed, open) = try await store.client.bounded.readingTogether(logger: logger) {
            (try await self.observe(now: now), try await self.store.open())
        }
        return try await apply(AlertRules.decide(observed, open: open.map(\.episode), now: now), open: open)
    }

    /// What `evaluate` would decide at `now`, written nowhere (`alerts evaluate --dry-run`).
    package func preview(now: Date) async throws -> [AlertDecision] {
        AlertRules.decide(try await observe(now: now), open: try await store.open().map(\.episode), now: now)
    }

    /// Every rule with what it observed at `now` (the rules set their gauges as they read; the
    /// queue's depth is set here).
    private func observe(now: Date) async throws -> [ObservedAlertRule] {
        var observed: [ObservedAlertRule] = []
        for rule in rules { observed.append(try await Self.observe(rule, source: source, now: now)) }
        if let metrics { metrics.record(depth: try await JobQueue(client: store.client, logger: logger).depth()) }
        return observed
    }

    private static func observe<Rule: MonitoredAlertRule>(_ rule: Rule, source: AlertSource, now: Date) async throws -> ObservedAlertRule {
        ObservedAlertRule(rule, observed: try await rule.observe(source, now: now))
    }

    /// What a message says, in the words of its kind's rule.
    package func subject(_ message: AlertMessage) -> String {
        if let rule = rules.first(where: { $0.kind == message.episode.key.kind }) { return rule.subject(message) }
        return message.episode.key.kind == .test ? AlertMessage.testSubject : "\(message.episode.key): \(message.episode.peak)"
    }

    /// A message's line for people (the log, Slack).
    package func text(_ message: AlertMessage) -> String { message.text(subject: subject(message)) }

    /// Each sink's message about `message` (`AlertSinks.messages`, in its rule's words).
    private var tell: @Sendable (AlertMessage) -> [SinkMessage] {
        { [sinks = configuration.sinks, self] message in sinks.messages(message, subject: self.subject(message)) }
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
                if let fired = try await store.fire(episode, window: window, sinks: tell) {
                    log(fired.message, silenced: fired.silencedBy != nil)
                    decisions.append(decision)
                }
            case .update(let episode):
                if let record { try await store.update(record.id, episode) }
            case .join(let episode, let joined):
                if var record {
                    record.episode = episode
                    let outcome = try await store.join(record, joined: joined, sinks: tell)
                    if outcome != .alreadyJoined {
                        log(AlertMessage(id: record.id, episode: episode, window: record.window, resolvedAt: nil, joined: joined), silenced: outcome == .silenced)
                        decisions.append(decision)
                    }
                }
            case .resolve(let episode, let at):
                if var record {
                    record.episode = episode
                    try await store.resolve(record, at: at, sinks: tell)
                    var message = record.message
                    message.resolvedAt = at
                    log(message, silenced: record.silencedBy != nil)
                    decisions.append(decision)
                    firing.remove(key)
                }
            }
        }
        metrics?.record(firing: Array(firing), kinds: rules.map(\.kind))
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
        case .firing, .updated: logger.warning("alert: \(text(message))", metadata: metadata)
        case .resolved: logger.notice("alert: \(text(message))", metadata: metadata)
        }
    }
}
