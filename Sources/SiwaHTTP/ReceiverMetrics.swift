import Prometheus
import SiwaDomain

/// The receiver's Prometheus metrics, created once from the process's registry.
package struct ReceiverMetrics: Sendable {
    let received: [String: Counter]
    let skipped: [SkipReason: Counter]
    let rejected: [RejectionReason: Counter]
    let sampledOut: [RejectionReason: Counter]
    let duration: DurationHistogram
    package let batchSize: ValueHistogram

    package init(registry: PrometheusCollectorRegistry) {
        received = Dictionary(uniqueKeysWithValues: ["accepted", "duplicate", "rejected", "unavailable"].map {
            ($0, registry.makeCounter(
                name: "siwa_notifications_received_total", labels: [("outcome", $0)],
                help: "Deliveries to POST /apple/notifications by outcome"))
        })
        skipped = Dictionary(uniqueKeysWithValues: [SkipReason.unreadableEvent, .unknownType].map {
            ($0, registry.makeCounter(
                name: "siwa_notifications_skipped_total", labels: [("reason", $0.rawValue)],
                help: "Genuine notifications stored with nothing to apply, by reason"))
        })
        rejected = Dictionary(uniqueKeysWithValues: RejectionReason.allCases.map {
            ($0, registry.makeCounter(
                name: "siwa_rejections_total", labels: [("reason", $0.rawValue)],
                help: "Refused deliveries by reason"))
        })
        sampledOut = Dictionary(uniqueKeysWithValues: RejectionReason.allCases.map {
            ($0, registry.makeCounter(
                name: "siwa_rejections_sampled_out_total", labels: [("reason", $0.rawValue)],
                help: "Refused deliveries counted but not recorded because of the per-minute sampling limit"))
        })
        duration = registry.makeDurationHistogram(
            name: "siwa_delivery_duration_seconds",
            buckets: [.milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5)],
            help: "Time from request to answer on POST /apple/notifications")
        batchSize = registry.makeValueHistogram(
            name: "siwa_commit_batch_size", buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            help: "Notifications per group-commit transaction")
    }

    func count(outcome: String) { received[outcome]?.increment() }
    func count(skipped reason: SkipReason) { skipped[reason]?.increment() }
    func count(rejected reason: RejectionReason) { rejected[reason]?.increment() }
    func count(sampledOut reason: RejectionReason) { sampledOut[reason]?.increment() }
}
