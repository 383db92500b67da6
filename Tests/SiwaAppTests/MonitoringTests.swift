import Foundation
import NIOHTTP1
import PostgresNIO
import Prometheus
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// What operators scrape and load: /metrics, the Prometheus rules and the Grafana dashboard in
/// deploy/, checked with Prometheus' own promtool.
@Suite("Monitoring: /metrics, deploy/prometheus/alerts.yml, deploy/grafana/siwa-events.json", .timeLimit(.minutes(10)))
struct MonitoringTests {

    static func promtool() throws -> String {
        try #require(
            ["/usr/bin/promtool", "/usr/local/bin/promtool"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "promtool is not installed: scripts/test installs Debian's prometheus package")
    }

    /// The exposition of a receiving process after traffic (one consent-revoked, one forged), plus
    /// the workers' and the alert evaluator's metrics after applying it and evaluating once.
    static func exposition() async throws -> String {
        let e = try await EffectHarness.start()
        let h = e.h
        try await e.post("consent-revoked", sub: "metrics-1", at: 1)
        // A genuine header and signature over another payload: bad_signature.
        let genuine = try h.notification().split(separator: ".")
        let other = try h.notification(type: "account-delete").split(separator: ".")
        _ = try await h.server.post(jws: "\(genuine[0]).\(other[1]).\(genuine[2])")
        await h.flushRejections()
        let receiver = try await h.server.request(.GET, "/metrics").body

        // An app transfer with one user left: the evaluator exposes its users and days left.
        let transfers = TransferStore(client: e.client, logger: h.logs.logger())
        let transfer = try await transfers.start(
            .outgoing, clientID: Harness.aud, aud: Harness.aud, teamID: "TEAMB23456", transferredAt: Date().addingTimeInterval(-50 * 86_400), actor: "test")
        try await e.client.query("INSERT INTO accounts (aud, sub) VALUES (\(Harness.aud), 'metrics-moving')")
        #expect(try await transfers.listUsers(of: transfer) == 1)

        let registry = PrometheusCollectorRegistry()
        let monitor = AlertMonitor(
            configuration: .init(), store: AlertStore(client: e.client, logger: h.logs.logger()), logger: h.logs.logger(), identity: "metrics-test",
            metrics: AlertMetrics(registry: registry))
        try await monitor.evaluate(now: Date())  // the job is still queued: depth 1
        // The endpoint check of the receiver's own URL, plain http (so the url check fails); then
        // a result with a certificate, as a check that completed a handshake stores one.
        var endpoint = EndpointHealthSettings()
        endpoint.url = URL(string: "\(h.server.baseURL)/apple/notifications")
        let endpointMetrics = EndpointMetrics(registry: registry)
        let checker = EndpointChecker(
            settings: endpoint, store: EndpointCheckStore(client: e.client, logger: h.logs.logger()), leases: LeaseStore(client: e.client, logger: h.logs.logger()),
            logger: h.logs.logger(), identity: "metrics-test", metrics: endpointMetrics)
        let checked = try await checker.runOnce(now: Date()).report
        #expect(checked?.failing == .url && checked?.findings.contains { $0.check == .route && $0.level == .ok } == true, "\(String(describing: checked))")
        endpointMetrics.record(
            EndpointReport(url: endpoint.url!.absoluteString, checkedAt: Date(), findings: [], certificateExpiresAt: Date().addingTimeInterval(90 * 86_400)), now: Date(),
            certificateDays: endpoint.certificateDays, checked: false)
        let workers = EffectWorkers(
            configuration: e.workers.configuration, store: EffectStore(client: e.client, logger: h.logs.logger()), logger: h.logs.logger(),
            metrics: WorkerMetrics(registry: registry))
        #expect(try await workers.effects[0].runOnce().claimed == 1)
        await e.stop()
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return receiver + String(decoding: buffer, as: UTF8.self)
    }

    @Test("/metrics passes promtool check metrics, and its counters move as notifications arrive and effects apply")
    func metricsLint() async throws {
        let text = try await Self.exposition()
        #expect(text.contains(#"siwa_notifications_received_total{outcome="accepted"} 1"#))
        #expect(text.contains(#"siwa_notifications_accepted_total{aud="\#(Harness.aud)",type="consent-revoked"} 1"#))
        #expect(text.contains(#"siwa_rejections_total{reason="bad_signature"} 1"#))
        #expect(text.contains("siwa_verification_duration_seconds_count 1"), "one notification verified (the forged one fails)")
        #expect(text.contains("siwa_commit_wait_duration_seconds_count 1"))
        #expect(text.contains(#"siwa_jwks_refreshes_total{outcome="ok"} 1"#))
        #expect(!text.contains("siwa_jwks_age_seconds -1"), "a key set is loaded")
        #expect(text.contains(#"siwa_queue_jobs{lane="effects",state="available"} 1"#))
        #expect(text.contains(#"siwa_effects_total{type="consent-revoked",effect="consent_revoked"} 1"#))
        #expect(text.contains(#"siwa_job_attempts_total{lane="effects",outcome="applied"} 1"#))
        #expect(text.contains(#"siwa_job_duration_seconds_count{lane="effects"} 1"#))
        #expect(text.contains(#"siwa_transfer_users_left{aud="\#(Harness.aud)",direction="outgoing",team="TEAMB23456"} 1"#), "\(text)")
        #expect(text.contains(#"siwa_transfer_window_close_timestamp_seconds{aud="\#(Harness.aud)",direction="outgoing",team="TEAMB23456"}"#))
        #expect(text.contains(#"siwa_endpoint_check_failed{check="url"} 0"#), "the later result passed")
        #expect(text.contains(#"siwa_endpoint_checks_total{outcome="failing"} 1"#))
        #expect(text.contains("siwa_endpoint_healthy 1"))
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("metrics-\(UUID().uuidString).txt")
        try Data(text.utf8).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try await Subprocess.run("/bin/sh", ["-c", "\(try Self.promtool()) check metrics < \(file.path)"], environment: [:])
        #expect(result.succeeded, "\(result.standardOutput)\(result.standardError)")
    }

    @Test("promtool check rules and test rules pass on the shipped rules; rules and dashboard use only metrics the service exposes")
    func rulesAndDashboard() async throws {
        let rules = Repository.root.appendingPathComponent("deploy/prometheus/alerts.yml")
        let check = try await Subprocess.run(try Self.promtool(), ["check", "rules", rules.path], environment: [:])
        #expect(check.succeeded, "\(check.standardOutput)\(check.standardError)")
        #expect(check.standardOutput.contains("SUCCESS"))
        // Unit tests of the rules: a spike after 8 days of steady traffic fires for that app only,
        // steady high traffic does not, queue lag fires after its `for`.
        let unit = try await Subprocess.run(
            try Self.promtool(), ["test", "rules", "alerts.test.yml"], environment: [:],
            workingDirectory: Repository.root.appendingPathComponent("deploy/prometheus").path)
        #expect(unit.succeeded, "\(unit.standardOutput)\(unit.standardError)")

        let dashboard = try Data(contentsOf: Repository.root.appendingPathComponent("deploy/grafana/siwa-events.json"))
        let json = try #require(JSONValue.parse(dashboard), "the dashboard is JSON")
        let panels = json["panels"]?.arrayValue ?? []
        #expect(panels.count >= 6)
        let expressions = panels.flatMap { $0["targets"]?.arrayValue ?? [] }.compactMap { $0["expr"]?.stringValue }
        #expect(!expressions.isEmpty)

        // Every siwa_* series either names refer to is exposed (histograms by their _bucket/_sum/_count).
        let exposed = Set(
            try await Self.exposition().split(separator: "\n").filter { !$0.hasPrefix("#") }
                .compactMap { $0.split(whereSeparator: { $0 == "{" || $0 == " " }).first.map(String.init) })
        let referenced = Set(
            (expressions + [try String(contentsOf: rules, encoding: .utf8)]).flatMap { text in
                text.matches(of: /siwa_[a-z_]+/).map { String($0.output) }
            })
        #expect(!referenced.isEmpty)
        for name in referenced {
            #expect(exposed.contains(name), "\(name) is referenced by deploy/ but /metrics has no such series")
        }
    }
}
