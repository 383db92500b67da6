import Prometheus
import SiwaDomain
import SiwaStore

/// The alert evaluator's gauges, set each round by the process holding the `alerts` lease (the
/// others keep their last values: aggregate with max() across replicas).
package struct AlertMetrics: Sendable {
    let firing: [AlertKind: Gauge]
    let queueLag: Gauge
    let discarded: Gauge
    let badSignatures: Gauge
    let appleInvalidClient: Gauge
    let depth: [String: Gauge]

    static let depthStates = ["available", "retryable", "running", "discarded"]

    package init(registry: PrometheusCollectorRegistry) {
        var depth: [String: Gauge] = [:]
        for lane in Lane.all.map(\.rawValue) {
            for state in Self.depthStates {
                depth[lane + "/" + state] = registry.makeGauge(
                    descriptor: MetricNameDescriptor(
                        namespace: "siwa", metricName: "queue_jobs", unitName: "", helpText: "Jobs not completed, by lane and state (set by the alert evaluator)"),
                    labels: [("lane", lane), ("state", state)])
            }
        }
        self.depth = depth
        firing = Dictionary(uniqueKeysWithValues: AlertKind.allCases.filter { $0 != .test }.map {
            ($0, registry.makeGauge(
                descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "alerts_firing", unitName: "", helpText: "Open alert episodes by kind (built-in detector)"),
                labels: [("kind", $0.rawValue)]))
        })
        queueLag = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "siwa", metricName: "queue_lag", unitName: "seconds", helpText: "How long the oldest ready job (any lane) has waited"))
        discarded = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "siwa", metricName: "jobs_discarded_window", unitName: "", helpText: "Jobs discarded after their last attempt within SIWA_SPIKE_WINDOW"))
        badSignatures = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "siwa", metricName: "bad_signatures_window", unitName: "", helpText: "Deliveries refused for a bad signature within SIWA_SPIKE_WINDOW"))
        appleInvalidClient = registry.makeGauge(
            descriptor: MetricNameDescriptor(
                namespace: "siwa", metricName: "apple_invalid_client_window", unitName: "",
                helpText: "Calls to Apple's auth endpoints refused with invalid_client (our client secret) within SIWA_SPIKE_WINDOW"))
    }

    func record(signals: AlertStore.OperationalSignals) {
        queueLag.set(Double(signals.queueLag))
        discarded.set(Double(signals.discarded))
        badSignatures.set(Double(signals.badSignatures))
        appleInvalidClient.set(Double(signals.appleInvalidClient))
    }

    func record(depth rows: [JobQueue.Depth]) {
        for gauge in depth.values { gauge.set(0.0) }
        for row in rows { depth[row.lane.rawValue + "/" + row.state.rawValue]?.set(Double(row.count)) }
    }

    func record(firing keys: [AlertKey]) {
        for (kind, gauge) in firing { gauge.set(Double(keys.filter { $0.kind == kind }.count)) }
    }
}
