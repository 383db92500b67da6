import Foundation

/// An alert rule, pure: its kind, what it observes, a step over that observation and the open
/// episodes of its kind with `now` passed in, and what its messages say. Its settings are its
/// stored properties. Rules are values in a list (`AlertRules.decide` steps each); the monitor
/// (SiwaWorkers) gathers each rule's observation and writes what the steps decide, so a new rule
/// needs no branch anywhere else.
package protocol AlertRule: Sendable {
    /// What one evaluation reads (counts, a report, …).
    associatedtype Observation: Sendable

    /// The alerts this rule owns: it is handed every open episode of this kind, and only those.
    var kind: AlertKind { get }

    /// The decisions at `now` about the rule's series: fire, update, join or resolve (`.none`
    /// for a series with nothing to do is dropped by the engine).
    func step(_ observation: Observation, open: [AlertEpisode], now: Date) -> [AlertDecision]

    /// What a message of this rule says, without its state, series joined, times or id.
    func subject(_ message: AlertMessage) -> String
}

extension AlertRule {
    /// The message's line for people (Slack, logs), in this rule's words.
    package func text(_ message: AlertMessage) -> String { message.text(subject: subject(message)) }
}

/// A rule with what it observed this round, ready to be stepped.
package struct ObservedAlertRule: Sendable {
    package let kind: AlertKind
    let step: @Sendable (_ open: [AlertEpisode], _ now: Date) -> [AlertDecision]

    package init<Rule: AlertRule>(_ rule: Rule, observed: Rule.Observation) {
        kind = rule.kind
        step = { open, now in rule.step(observed, open: open, now: now) }
    }
}

/// The engine, one pure function: each rule stepped over its observation and the open episodes
/// of its kind. The monitor reads, calls this, and writes what it says.
package enum AlertRules {
    /// The decisions at `now`, rule by rule in the order given (none for a series with nothing
    /// to do). An open episode of a kind no rule owns is left as it is.
    package static func decide(_ rules: [ObservedAlertRule], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let openByKind = Dictionary(grouping: open, by: \.key.kind)
        return rules.flatMap { $0.step(openByKind[$0.kind] ?? [], now) }.filter { $0 != .none }
    }
}

/// The built-in rules' settings (`SIWA_SPIKE_*`, `SIWA_ALERT_*`); the monitor builds its rules
/// from them.
package struct AlertRuleSettings: Sendable, Equatable {
    /// The revocation spike rule's, and the evaluation's interval, window and resolve delay, which
    /// every built-in rule shares.
    package var spike = SpikeSettings()
    /// queue_lag fires when the oldest ready job has waited this long.
    package var queueLag: Duration = .seconds(120)
    /// bad_signatures fires at this many in the spike window.
    package var badSignatures = 20
    /// jobs_discarded fires at this many discards of one lane in the spike window.
    package var discardedJobs = 1
    /// suppression_target_failing fires when a provider's operation has failed this long.
    package var suppressionFailing: Duration = .seconds(600)
    package var transferDeadline = TransferDeadlineSettings()
    package var quiet = QuietSettings()
    /// endpoint_unhealthy: the URL checked (`SIWA_PUBLIC_URL`) and the certificate's days.
    package var endpoint = EndpointHealthSettings()

    package init() {}
}
