import Foundation
import Prometheus
import SiwaDomain
import Synchronization
import SiwaStore

/// The alert evaluator's gauges, set each round by the process holding the `alerts` lease (the
/// others keep their last values: aggregate with max() across replicas).
package final class AlertMetrics: Sendable {
    /// Open episodes by kind: the built-in kinds' from the start, a declared rule's from its first round.
    private let firing = Mutex<[AlertKind: Gauge]>([:])
    let queueLag: Gauge
    let discarded: Gauge
    let badSignatures: Gauge
    let appleInvalidClient: Gauge
    let depth: [String: Gauge]
    let registry: PrometheusCollectorRegistry
    /// Per app transfer with its window open: users left and when the window closes, by `AlertKey`.
    private let transfers = Mutex<[AlertKey: (usersLeft: Gauge, closes: Gauge)]>([:])

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
        self.registry = registry
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
        for rule in AlertRuleSettings().builtInRules(apps: []) { _ = gauge(firing: rule.kind) }
    }

    /// The gauge of `kind`'s open episodes, made the first time it is asked for.
    private func gauge(firing kind: AlertKind) -> Gauge {
        let registry = self.registry
        return firing.withLock { gauges in
            if let gauge = gauges[kind] { return gauge }
            let gauge = registry.makeGauge(
                descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "alerts_firing", unitName: "", helpText: "Open alert episodes by kind (built-in detector)"),
                labels: [("kind", kind.rawValue)])
            gauges[kind] = gauge
            return gauge
        }
    }

    func record(depth rows: [JobQueue.Depth]) {
        for gauge in depth.values { gauge.set(0.0) }
        for row in rows { depth[row.lane.rawValue + "/" + row.state.rawValue]?.set(Double(row.count)) }
    }

    /// Each open transfer's users left and its window's close (labels `aud`, `direction`,
    /// `team`); a transfer whose window closed is dropped from the exposition.
    func record(transfers backlogs: [TransferBacklog]) {
        let registry = self.registry
        transfers.withLock { gauges in
            for key in Set(gauges.keys).subtracting(backlogs.map(\.key)) {
                if let dropped = gauges.removeValue(forKey: key) {
                    registry.unregisterGauge(dropped.usersLeft)
                    registry.unregisterGauge(dropped.closes)
                }
            }
            for backlog in backlogs {
                let pair = gauges[backlog.key] ?? {
                    let words = (backlog.key.type ?? "").split(separator: " ")
                    let labels = [
                        ("aud", backlog.key.aud ?? ""), ("direction", words.first == "to" ? "outgoing" : "incoming"), ("team", words.last.map(String.init) ?? ""),
                    ]
                    return (
                        registry.makeGauge(
                            descriptor: MetricNameDescriptor(
                                namespace: "siwa", metricName: "transfer_users_left", unitName: "",
                                helpText: "Users an app transfer still needs Apple for (set by the alert evaluator while its window is open)"),
                            labels: labels),
                        registry.makeGauge(
                            descriptor: MetricNameDescriptor(
                                namespace: "siwa", metricName: "transfer_window_close_timestamp", unitName: "seconds",
                                helpText: "When an app transfer's 60-day window closes, Unix time (set by the alert evaluator)"),
                            labels: labels)
                    )
                }()
                pair.usersLeft.set(Double(backlog.usersLeft))
                pair.closes.set(backlog.window.closesAt.timeIntervalSince1970)
                gauges[backlog.key] = pair
            }
        }
    }

    /// The open episodes of each of `kinds` (the rules evaluated) among `keys`.
    func record(firing keys: [AlertKey], kinds: [AlertKind]) {
        for kind in kinds { gauge(firing: kind).set(Double(keys.filter { $0.kind == kind }.count)) }
    }
}
