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
        registry.makeCounter(
            descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "job_attempts", unitName: "total", helpText: "Job attempts by lane and outcome"),
            labels: [("lane", lane), ("outcome", outcome)]
        ).increment()
        durations[lane]?.record(duration)
    }

    /// An applied effect: its event type and what it changed (`consent_revoked`, `none`, …).
    func effect(type: String, effect: String) {
        registry.makeCounter(
            descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "effects", unitName: "total", helpText: "Effects applied by event type and what changed"),
            labels: [("type", type), ("effect", effect)]
        ).increment()
    }
}
