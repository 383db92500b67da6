import Prometheus
import SiwaDomain
import SiwaStore

/// The worker loops' Prometheus metrics: attempts and their duration per lane, and effects by type.
package struct WorkerMetrics: Sendable {
    let registry: PrometheusCollectorRegistry
    let durations: [String: DurationHistogram]

    static let lanes = Lane.all.map(\.rawValue)

    package init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        durations = Dictionary(uniqueKeysWithValues: Self.lanes.map { lane in
            (lane, registry.makeDurationHistogram(
                descriptor: MetricNameDescriptor(
                    namespace: "siwa", metricName: "job_duration", unitName: "seconds",
                    helpText: "One attempt at a job, claim to recorded outcome (effects: the batch it was applied in)"),
                labels: [("lane", lane)],
                buckets: [.milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
                          .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5), .seconds(30)]))
        })
    }

    /// One attempt of a job in `lane` that ended with `outcome` (applied, delivered, retrying,
    /// discarded, lease_lost).
    func attempt(lane: String, outcome: String, took duration: Duration) {
        attempts(lane: lane, outcome: outcome, count: 1, took: duration)
    }

    /// `count` attempts of jobs in `lane` that ended with `outcome`, each taking `duration`.
    private func attempts(lane: String, outcome: String, count: Int, took duration: Duration) {
        registry.makeCounter(
            descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "job_attempts", unitName: "total", helpText: "Job attempts by lane and outcome"),
            labels: [("lane", lane), ("outcome", outcome)]
        ).increment(by: Int64(count))
        let histogram = durations[lane]
        for _ in 0..<count { histogram?.record(duration) }
    }

    /// The effects of a batch applied in `duration`: an `applied` attempt each, and each counted by
    /// its event type and what it changed (`consent_revoked`, `none`, …). Each counter is looked up
    /// once per batch, not once per effect.
    func applied(_ effects: [AppliedEffect], took duration: Duration) {
        guard !effects.isEmpty else { return }
        attempts(lane: Lane.effects.rawValue, outcome: "applied", count: effects.count, took: duration)
        var counts: [Pair: Int64] = [:]
        for effect in effects { counts[Pair(type: effect.type, effect: effect.effect), default: 0] += 1 }
        for (pair, count) in counts {
            registry.makeCounter(
                descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "effects", unitName: "total", helpText: "Effects applied by event type and what changed"),
                labels: [("type", pair.type), ("effect", pair.effect)]
            ).increment(by: count)
        }
    }

    private struct Pair: Hashable {
        var type: String
        var effect: String
    }
}
