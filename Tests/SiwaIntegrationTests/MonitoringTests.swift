import Foundation
import NIOHTTP1
import Prometheus
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import SiwaWorkers
import Testing

/// What operators scrape and load: /metrics, the Prometheus rules and the Grafana dashboard in
/// deploy/, checked with Prometheus' own promtool.
@Suite("Monitoring: /metrics, deploy/prometheus/alerts.yml, deploy/grafana/siwa-events.json")
struct MonitoringTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static func promtool() throws -> String {
        try #require(
            ["/usr/bin/promtool", "/usr/local/bin/promtool"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "promtool is not installed: scripts/test installs Debian's prometheus package")
    }

    /// The exposition of a receiving process after traffic, plus the alert evaluator's gauges.
    static func exposition() async throws -> String {
        let h = try await Harness.start()
        _ = try await h.server.post(jws: try h.notification(type: "consent-revoked"))
        // A genuine header and signature over another payload: bad_signature.
        let genuine = try h.notification().split(separator: ".")
        let other = try h.notification(type: "account-delete").split(separator: ".")
        _ = try await h.server.post(jws: "\(genuine[0]).\(other[1]).\(genuine[2])")
        await h.flushRejections()
        let receiver = try await h.server.request(.GET, "/metrics").body
        await h.stop()
        let registry = PrometheusCollectorRegistry()
        _ = AlertMetrics(registry: registry)
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return receiver + String(decoding: buffer, as: UTF8.self)
    }

    @Test("/metrics passes promtool check metrics, and its counters move as notifications arrive")
    func metricsLint() async throws {
        let text = try await Self.exposition()
        #expect(text.contains(#"siwa_notifications_received_total{outcome="accepted"} 1"#))
        #expect(text.contains(#"siwa_notifications_accepted_total{aud="\#(Harness.aud)",type="consent-revoked"} 1"#))
        #expect(text.contains(#"siwa_rejections_total{reason="bad_signature"} 1"#))
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("metrics-\(UUID().uuidString).txt")
        try Data(text.utf8).write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let result = try await Subprocess.run("/bin/sh", ["-c", "\(try Self.promtool()) check metrics < \(file.path)"], environment: [:])
        #expect(result.succeeded, "\(result.standardOutput)\(result.standardError)")
    }

    @Test("promtool check rules accepts the shipped rules; rules and dashboard use only metrics the service exposes")
    func rulesAndDashboard() async throws {
        let rules = Self.repository.appendingPathComponent("deploy/prometheus/alerts.yml")
        let check = try await Subprocess.run(try Self.promtool(), ["check", "rules", rules.path], environment: [:])
        #expect(check.succeeded, "\(check.standardOutput)\(check.standardError)")
        #expect(check.standardOutput.contains("SUCCESS"))

        let dashboard = try Data(contentsOf: Self.repository.appendingPathComponent("deploy/grafana/siwa-events.json"))
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
