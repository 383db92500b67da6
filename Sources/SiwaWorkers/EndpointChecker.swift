import Foundation
import Logging
import Prometheus
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore
import Synchronization

/// The background endpoint check (`SIWA_PUBLIC_URL`): every `SIWA_ENDPOINT_CHECK_INTERVAL` the
/// process holding the `endpoint_check` lease runs doctor's checks (`EndpointProbe`) and stores
/// the result, from which every process serves /health and the alert evaluator decides
/// `endpoint_unhealthy`. Rounds come more often than checks (at most every 15 minutes), so a new
/// holder checks on time and every process's metrics follow the stored result.
package final class EndpointChecker: Service, Sendable {
    package static let leaseName = "endpoint_check"

    /// What one round did.
    package enum Round: Sendable, Equatable {
        /// Another process holds the lease; the stored result (nil before the first check).
        case notHolder(EndpointReport?)
        /// The stored result is younger than the interval.
        case notDue(EndpointReport)
        /// Checked now: the result, stored.
        case checked(EndpointReport)

        package var report: EndpointReport? {
            switch self {
            case .notHolder(let report): report
            case .notDue(let report), .checked(let report): report
            }
        }
    }

    let settings: EndpointHealthSettings
    let store: EndpointCheckStore
    let leases: LeaseStore
    let logger: Logger
    let identity: String
    let metrics: EndpointMetrics?

    package init(settings: EndpointHealthSettings, store: EndpointCheckStore, leases: LeaseStore, logger: Logger, identity: String, metrics: EndpointMetrics? = nil) {
        self.settings = settings
        self.store = store
        self.leases = leases
        self.logger = logger
        self.identity = identity
        self.metrics = metrics
    }

    /// How often a round runs: the interval, at most 15 minutes.
    var pollInterval: Duration { min(settings.interval, .seconds(900)) }

    package func run() async throws {
        await Scheduler.run(.periodic(every: pollInterval, retryAfter: .seconds(60), phase: Phase.endpoint), once: { try await self.runOnce(now: Date()) }) { error in
            logger.warning("endpoint check failed; will retry", metadata: ["error": "\(loggable(error))"])
        }
        let (leases, identity) = (self.leases, self.identity)
        _ = try? await withDeadline(.seconds(5)) { try await leases.release(lease: Self.leaseName, holder: identity) }
    }

    /// The probe for the configured URL (and staging CA).
    package static func probe(_ settings: EndpointHealthSettings) throws -> EndpointProbe? {
        guard let url = settings.url else { return nil }
        var probe = try EndpointProbe(url: url.absoluteString, timeout: settings.timeout, expiryWarningDays: settings.certificateDays)
        if let caFile = settings.caFile { try probe.trust(caFile: caFile) }
        return probe
    }

    /// One round at `now`: checks if this process holds (or takes) the lease, judged at `leaseNow`
    /// (nil: PostgreSQL's time), and the stored result is at least an interval old; then sets the
    /// metrics from the latest result either way.
    @discardableResult
    package func runOnce(now: Date, leaseNow: Date? = nil) async throws -> Round {
        guard let probe = try Self.probe(settings) else { return .notHolder(nil) }
        let latest = try await store.latest(url: probe.text)
        let ttl = pollInterval * 2 + settings.timeout * 3 + .seconds(5)
        guard try await leases.acquire(lease: Self.leaseName, holder: identity, ttl: ttl, now: leaseNow) else {
            if let latest { metrics?.record(latest, now: now, certificateDays: settings.certificateDays, checked: false) }
            return .notHolder(latest)
        }
        if let latest, now.timeIntervalSince(latest.checkedAt) < settings.interval.timeInterval - 1 {
            metrics?.record(latest, now: now, certificateDays: settings.certificateDays, checked: false)
            return .notDue(latest)
        }
        let report = await probe.check(now: now)
        try await store.save(report)
        let verdict = EndpointHealthRule.verdict(report, now: now, certificateDays: settings.certificateDays)
        var metadata: Logger.Metadata = ["url": "\(URLRedaction.redacted(probe.url))"]
        for finding in report.findings where finding.level != .ok { metadata[finding.check.rawValue] = "\(finding.level.rawValue): \(finding.detail)" }
        switch verdict {
        case .healthy: logger.info("endpoint check: healthy", metadata: metadata)
        case .failing(let check): logger.warning("endpoint check: the \(check.rawValue) check failed", metadata: metadata)
        case .expiring(let days): logger.warning("endpoint check: the certificate expires in \(days) days", metadata: metadata)
        }
        metrics?.record(report, now: now, certificateDays: settings.certificateDays, checked: true)
        return .checked(report)
    }
}

/// The endpoint check's metrics, created with the first result (a process that never saw one
/// exposes none, rather than an unhealthy 0).
package final class EndpointMetrics: Sendable {
    struct Gauges {
        var healthy: Gauge
        var checkedAt: Gauge
        var failed: [EndpointCheck: Gauge]
        var expiry: Gauge?
    }

    let registry: PrometheusCollectorRegistry
    private let gauges = Mutex<Gauges?>(nil)
    /// Checks this process ran, by verdict.
    let checks: [String: Counter]

    package init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        checks = Dictionary(uniqueKeysWithValues: ["healthy", "failing", "expiring"].map { outcome in
            (outcome, registry.makeCounter(
                descriptor: MetricNameDescriptor(
                    namespace: "siwa", metricName: "endpoint_checks", unitName: "total",
                    helpText: "Checks of SIWA_PUBLIC_URL this process ran, by outcome (healthy, failing: a check failed, expiring: the certificate)"),
                labels: [("outcome", outcome)]))
        })
    }

    static func outcome(_ verdict: EndpointVerdict) -> String {
        switch verdict {
        case .healthy: "healthy"
        case .failing: "failing"
        case .expiring: "expiring"
        }
    }

    package func record(_ report: EndpointReport, now: Date, certificateDays: Int, checked: Bool) {
        let verdict = EndpointHealthRule.verdict(report, now: now, certificateDays: certificateDays)
        if checked { checks[Self.outcome(verdict)]?.increment() }
        let registry = self.registry
        gauges.withLock { gauges in
            var current = gauges ?? Gauges(
                healthy: registry.makeGauge(
                    descriptor: MetricNameDescriptor(
                        namespace: "siwa", metricName: "endpoint_healthy", unitName: "",
                        helpText: "1 when the latest check of SIWA_PUBLIC_URL passed and its certificate is not about to expire, else 0")),
                checkedAt: registry.makeGauge(
                    descriptor: MetricNameDescriptor(
                        namespace: "siwa", metricName: "endpoint_checked_timestamp", unitName: "seconds", helpText: "When SIWA_PUBLIC_URL was last checked, Unix time")),
                failed: Dictionary(uniqueKeysWithValues: EndpointCheck.allCases.map { check in
                    (check, registry.makeGauge(
                        descriptor: MetricNameDescriptor(
                            namespace: "siwa", metricName: "endpoint_check_failed", unitName: "", helpText: "1 when this check of SIWA_PUBLIC_URL failed in the latest check"),
                        labels: [("check", check.rawValue)]))
                }))
            current.healthy.set(verdict.isHealthy ? 1.0 : 0.0)
            current.checkedAt.set(report.checkedAt.timeIntervalSince1970)
            for (check, gauge) in current.failed { gauge.set(report.findings.contains { $0.check == check && $0.level == .fail } ? 1.0 : 0.0) }
            if let expiry = report.certificateExpiresAt {
                let gauge = current.expiry ?? registry.makeGauge(
                    descriptor: MetricNameDescriptor(
                        namespace: "siwa", metricName: "endpoint_certificate_expiry_timestamp", unitName: "seconds",
                        helpText: "When the certificate SIWA_PUBLIC_URL serves expires, Unix time (as of the latest check that completed a handshake)"))
                gauge.set(expiry.timeIntervalSince1970)
                current.expiry = gauge
            }
            gauges = current
        }
    }
}
