import Foundation

/// `suppression_target_failing`: a mail provider has kept failing: an operation of its lane has
/// waited, failing, `threshold` or longer, or one ran out of attempts in the window. One series
/// per provider (`type`): the alert names it, and so what to run. It observes, per provider, the
/// seconds its oldest failing operation has waited (a dead letter counts as the threshold).
package struct SuppressionTargetRule: AlertRule {
    package let kind = AlertKind.suppressionTargetFailing
    package var threshold: Duration
    package var resolveAfter: Duration

    package init(threshold: Duration, resolveAfter: Duration) {
        self.threshold = threshold
        self.resolveAfter = resolveAfter
    }

    /// What one provider's lane shows: how long its oldest failing operation has waited (nil:
    /// none failing) and its dead letters in the window.
    package struct Observed: Sendable, Equatable {
        package var failingFor: Duration?
        package var discarded: Int

        package init(failingFor: Duration?, discarded: Int) {
            self.failingFor = failingFor
            self.discarded = discarded
        }
    }

    package func step(_ targets: [SuppressionTarget: Observed], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let limit = Int(threshold.timeInterval)
        var observations: [AlertKey: AlertObservation] = [:]
        for (target, observed) in targets {
            var seconds = observed.failingFor.map { Int($0.timeInterval) } ?? 0
            if observed.discarded > 0 { seconds = max(seconds, limit) }
            observations[AlertKey(kind: kind, type: target.rawValue)] = .atLeast(limit, value: seconds)
        }
        return AlertLifecycle.step(observations, open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        let target = message.episode.key.type ?? "a mail provider"
        return "suppressions at \(target) have kept failing (\(message.episode.peak) s): addresses Apple turned off may still be mailed;"
            + " see `siwa-events suppressions list --target \(target) --failed`, fix the cause (often its key), then `siwa-events suppressions retry --target \(target) --discarded`"
    }
}
