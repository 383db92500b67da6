import Prometheus
import SiwaDomain

/// The receiver's Prometheus metrics, created once from the process's registry.
package struct ReceiverMetrics: Sendable {
    let received: [String: Counter]
    let skipped: [SkipReason: Counter]
    let rejected: [RejectionReason: Counter]
    let sampledOut: [RejectionReason: Counter]
    let droppedRejections: Counter
    let duration: DurationHistogram
    let verification: DurationHistogram
    let durable: DurationHistogram
    let keyRefreshes: [Bool: Counter]
    package let keySetAge: Gauge
    package let batchSize: ValueHistogram
    let accepted: [String: [String: Counter]]
    let connectionsClosed: [String: [ConnectionCut: Counter]]
    let connectionsOpen: [String: Gauge]

    /// `audiences`: the configured bundle IDs (the only aud a notification can be recorded with).
    package init(registry: PrometheusCollectorRegistry, audiences: [String] = []) {
        accepted = Self.acceptedCounters(registry, audiences: audiences)
        (connectionsClosed, connectionsOpen) = Self.connectionMetrics(registry)
        received = Dictionary(uniqueKeysWithValues: ["accepted", "duplicate", "rejected", "refused", "unavailable"].map {
            ($0, registry.makeCounter(
                descriptor: Self.name("notifications_received", "total", "Deliveries to POST /apple/notifications by outcome"),
                labels: [("outcome", $0)]))
        })
        skipped = Dictionary(uniqueKeysWithValues: [SkipReason.unreadableEvent, .unknownType].map {
            ($0, registry.makeCounter(
                descriptor: Self.name("notifications_skipped", "total", "Genuine notifications stored with nothing to apply, by reason"),
                labels: [("reason", $0.rawValue)]))
        })
        rejected = Dictionary(uniqueKeysWithValues: RejectionReason.allCases.map {
            ($0, registry.makeCounter(
                descriptor: Self.name("rejections", "total", "Refused deliveries by reason"), labels: [("reason", $0.rawValue)]))
        })
        sampledOut = Dictionary(uniqueKeysWithValues: RejectionReason.allCases.map {
            ($0, registry.makeCounter(
                descriptor: Self.name(
                    "rejections_sampled_out", "total", "Refused deliveries counted but not recorded because of the per-minute sampling limit"),
                labels: [("reason", $0.rawValue)]))
        })
        droppedRejections = registry.makeCounter(
            descriptor: Self.name("rejections_dropped", "total", "Rejection records the database refused for their content (dropped, logged once)"))
        duration = registry.makeDurationHistogram(
            descriptor: Self.name("delivery_duration", "seconds", "Time from request to answer on POST /apple/notifications"),
            buckets: [.milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5)])
        verification = registry.makeDurationHistogram(
            descriptor: Self.name("verification_duration", "seconds", "RS256 signature and claims check of one notification (key resolved)"),
            buckets: [.microseconds(10), .microseconds(25), .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(5)])
        durable = registry.makeDurationHistogram(
            descriptor: Self.name(
                "commit_wait_duration", "seconds", "From a verified notification handed to group commit to its durable COMMIT (what a 200 waits on)"),
            buckets: [.milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(5)])
        keyRefreshes = Dictionary(uniqueKeysWithValues: [true, false].map {
            ($0, registry.makeCounter(
                descriptor: Self.name("jwks_refreshes", "total", "Fetches of Apple's key set (SIWA_APPLE_JWKS_URL) by outcome"),
                labels: [("outcome", $0 ? "ok" : "failed")]))
        })
        keySetAge = registry.makeGauge(
            descriptor: Self.name("jwks_age", "seconds", "Age of the Apple key set in use, since it was fetched (-1: none loaded)"))
        batchSize = registry.makeValueHistogram(
            descriptor: Self.name("commit_batch", "size", "Notifications per group-commit transaction"),
            buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    }

    /// One counter per configured app and canonical type (an unknown type counts as `unknown`).
    private static func acceptedCounters(_ registry: PrometheusCollectorRegistry, audiences: [String]) -> [String: [String: Counter]] {
        Dictionary(uniqueKeysWithValues: audiences.map { aud in
            (aud, Dictionary(uniqueKeysWithValues: (EventType.allCases.map(\.rawValue) + ["unknown"]).map { type in
                (type, registry.makeCounter(
                    descriptor: Self.name("notifications_accepted", "total", "Notifications recorded (not duplicates), by app and canonical type"),
                    labels: [("aud", aud), ("type", type)]))
            }))
        })
    }

    /// Per listener: connections closed by the server (by reason), and connections open.
    private static func connectionMetrics(_ registry: PrometheusCollectorRegistry) -> ([String: [ConnectionCut: Counter]], [String: Gauge]) {
        let listeners = ["public", "admin"]
        let closed = Dictionary(uniqueKeysWithValues: listeners.map { listener in
            (listener, Dictionary(uniqueKeysWithValues: ConnectionCut.allCases.map { cut in
                (cut, registry.makeCounter(
                    descriptor: Self.name("connections_closed", "total", "Connections the server closed itself: over the maximum (refused, or the longest-idle making room), or past a deadline"),
                    labels: [("listener", listener), ("reason", cut.rawValue)]))
            }))
        })
        let open = Dictionary(uniqueKeysWithValues: listeners.map { listener in
            (listener, registry.makeGauge(
                descriptor: MetricNameDescriptor(namespace: "siwa", metricName: "connections_open", unitName: "", helpText: "Open HTTP connections"),
                labels: [("listener", listener)]))
        })
        return (closed, open)
    }

    /// `siwa_<metric>_<unit>`, with the help text promtool wants.
    static func name(_ metric: String, _ unit: String, _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "siwa", metricName: metric, unitName: unit, helpText: help)
    }

    func count(outcome: String) { received[outcome]?.increment() }

    package func count(keyRefresh succeeded: Bool) { keyRefreshes[succeeded]?.increment() }

    /// Accepted notifications by app and type (types outside Apple's four count as `unknown`).
    /// Revocation spike rules read it.
    func count(accepted aud: String, type: EventType?) {
        accepted[aud]?[type?.rawValue ?? "unknown"]?.increment()
    }
    func count(skipped reason: SkipReason) { skipped[reason]?.increment() }
    func count(rejected reason: RejectionReason) { rejected[reason]?.increment() }
    func count(sampledOut reason: RejectionReason) { sampledOut[reason]?.increment() }
    package func count(cut: ConnectionCut, listener: some RawRepresentable<String>) { connectionsClosed[listener.rawValue]?[cut]?.increment() }
    package func set(openConnections count: Int, listener: some RawRepresentable<String>) { connectionsOpen[listener.rawValue]?.set(Double(count)) }
    func count(droppedRejections count: Int) { droppedRejections.increment(by: Int64(count)) }
}
