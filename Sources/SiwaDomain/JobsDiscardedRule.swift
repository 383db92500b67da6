import Foundation

/// `jobs_discarded`: jobs that ran out of attempts, at least `threshold` of one lane in the
/// window. One series per lane (`type`): the alert names the lane, and so what to run. It
/// observes the discards in the window by lane.
package struct JobsDiscardedRule: AlertRule {
    package let kind = AlertKind.jobsDiscarded
    package var threshold: Int
    package var resolveAfter: Duration

    package init(threshold: Int, resolveAfter: Duration) {
        self.threshold = threshold
        self.resolveAfter = resolveAfter
    }

    package func step(_ discardedByLane: [String: Int], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        var observations: [AlertKey: AlertObservation] = [:]
        for (lane, count) in discardedByLane where count > 0 {
            observations[AlertKey(kind: kind, type: lane)] = .atLeast(threshold, value: count)
        }
        return AlertLifecycle.step(observations, open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        let (peak, window) = (message.episode.peak, DurationSyntax.format(message.window))
        guard let lane = message.episode.key.type else { return "\(peak) jobs discarded after their last attempt in \(window)" }
        return "\(peak) \(lane) jobs discarded after their last attempt in \(window)" + Self.hint(lane: lane)
    }

    /// What to run for a lane's discarded jobs, once their cause is fixed.
    static func hint(lane: String) -> String {
        switch lane {
        case "effects": ": fix the cause, then `siwa-events jobs retry --discarded`"
        case "callbacks": ": see `siwa-events callbacks list --failed`, then `siwa-events callbacks redeliver`"
        case "apple_revocations":
            ": their tokens are kept, unrevoked, until Apple takes them: see `siwa-events apple revocations --failed`, then `siwa-events apple retry --discarded`"
        default: ""
        }
    }
}
