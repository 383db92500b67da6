import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// What a rule's `observe` reads through: the database (each rule reads with the store of the
/// tables it watches), the evaluation window, and the evaluator's gauges.
package struct AlertSource: Sendable {
    package let client: PostgresClient
    package let logger: Logger
    /// `SIWA_SPIKE_WINDOW`: counts are taken over the window ending at `now`.
    package let window: Duration
    let metrics: AlertMetrics?

    package init(client: PostgresClient, logger: Logger, window: Duration) {
        self.init(client: client, logger: logger, window: window, metrics: nil)
    }

    init(client: PostgresClient, logger: Logger, window: Duration, metrics: AlertMetrics?) {
        self.client = client
        self.logger = logger
        self.window = window
        self.metrics = metrics
    }

    /// Where the window ending at `now` starts.
    package func windowStart(_ now: Date) -> Date { now.addingTimeInterval(-window.timeInterval) }
}

/// An alert rule the monitor runs: a pure `AlertRule` (its kind, step, settings and message) and
/// how it gathers its observation. `AlertMonitor.Configuration.registered` lists them.
package protocol MonitoredAlertRule: AlertRule {
    /// What the rule judges at `now`, read through `source`.
    func observe(_ source: AlertSource, now: Date) async throws -> Observation
}

/// A pure rule and the closure that observes for it: how the built-in rules are listed
/// (`AlertRuleSettings.builtInRules`), and a short way to declare one elsewhere.
package struct ObservingRule<Rule: AlertRule>: MonitoredAlertRule {
    package let rule: Rule
    let observing: @Sendable (AlertSource, Date) async throws -> Rule.Observation

    package init(_ rule: Rule, observe: @escaping @Sendable (_ source: AlertSource, _ now: Date) async throws -> Rule.Observation) {
        self.rule = rule
        self.observing = observe
    }

    package var kind: AlertKind { rule.kind }

    package func observe(_ source: AlertSource, now: Date) async throws -> Rule.Observation {
        try await observing(source, now)
    }

    package func step(_ observation: Rule.Observation, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        rule.step(observation, open: open, now: now)
    }

    package func subject(_ message: AlertMessage) -> String { rule.subject(message) }
}
