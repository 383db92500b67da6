import Foundation

/// `queue_lag`: the oldest ready job (any lane) has waited `threshold` or longer. One series; it
/// observes the wait in seconds.
package struct QueueLagRule: AlertRule {
    package let kind = AlertKind.queueLag
    package var threshold: Duration
    package var resolveAfter: Duration

    package init(threshold: Duration, resolveAfter: Duration) {
        self.threshold = threshold
        self.resolveAfter = resolveAfter
    }

    package func step(_ lag: Int, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let observation = AlertObservation.atLeast(Int(threshold.timeInterval), value: lag)
        return AlertLifecycle.step([AlertKey(kind: kind): observation], open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        "the oldest ready job waited \(message.episode.peak) s (threshold \(Int(message.episode.threshold)) s)"
    }
}
