import Foundation
import Hummingbird
import NIOHTTP1
import PostgresNIO
import Prometheus
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The background endpoint check (`SIWA_PUBLIC_URL`) against the real receiver serving HTTPS
/// itself on one loopback port, restarted with each certificate (a local CA's, trusted through
/// `SIWA_PUBLIC_URL_CA_FILE`): the checker's rounds and the alert evaluator driven by hand with
/// the clock moved an interval each time; the admin `/health` and the metrics read back.
@Suite("Endpoint health: the background check of SIWA_PUBLIC_URL, endpoint_unhealthy, /health, metrics", .timeLimit(.minutes(10)))
struct EndpointHealthTests {
    /// A throwaway CA and leaf certificates it signs, made with openssl.
    struct Certificates {
        let directory: URL
        var ca: String { directory.appendingPathComponent("ca.pem").path }

        static func make() async throws -> Certificates {
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("endpoint-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let certificates = Certificates(directory: directory)
            try await certificates.openssl(
                ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                 "-days", "30", "-subj", "/CN=siwa-events test CA", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            return certificates
        }

        /// A certificate for `name` signed by the CA, valid `days` from now: (certificate, key).
        func leaf(_ name: String, days: Int) async throws -> (certificate: String, key: String) {
            let base = "\(name)-\(days)"
            try Data("subjectAltName=DNS:\(name)\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n".utf8)
                .write(to: directory.appendingPathComponent("\(base).ext"))
            try await openssl(
                ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "\(base).key", "-out", "\(base).csr",
                 "-subj", "/CN=\(name)"])
            try await openssl(
                ["x509", "-req", "-in", "\(base).csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "\(base).pem",
                 "-days", "\(days)", "-extfile", "\(base).ext"])
            return (directory.appendingPathComponent("\(base).pem").path, directory.appendingPathComponent("\(base).key").path)
        }

        func openssl(_ arguments: [String]) async throws {
            let result = try await Subprocess.run(
                "/usr/bin/env", ["openssl"] + arguments, environment: ProcessInfo.processInfo.environment, workingDirectory: directory.path)
            try #require(result.succeeded, "openssl \(arguments.joined(separator: " ")): \(result.combinedOutput)")
        }

        func remove() { try? FileManager.default.removeItem(at: directory) }
    }

    /// The receiver serving HTTPS on `port` with `leaf`, over `database`, checking itself.
    static func serve(_ leaf: (certificate: String, key: String), port: Int, settings: EndpointHealthSettings, database: PostgresClient.Configuration) async throws -> Harness {
        try await Harness.start(database: database) { config in
            config.http.port = port
            config.http.tlsCertificateFile = leaf.certificate
            config.http.tlsKeyFile = leaf.key
            config.alerts.endpoint = settings
            // A loaded machine (the whole suite on 2 cores) may take seconds over a handshake: the
            // test judges what the check finds, not how fast, so neither side gives up early.
            config.http.limits.tlsHandshakeTimeout = .seconds(120)
        }
    }

    static func metrics(_ registry: PrometheusCollectorRegistry) -> String {
        var buffer: [UInt8] = []
        registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }

    @Test("endpoint health: a certificate for the wrong name fails tls, one expiring in 3 days fires certificate, each once; a healthy endpoint resolves both")
    func endpointHealth() async throws {
        let certificates = try await Certificates.make()
        defer { certificates.remove() }
        let wrongName = try await certificates.leaf("wrong.example", days: 90)
        let expiring = try await certificates.leaf("localhost", days: 3)
        let healthy = try await certificates.leaf("localhost", days: 90)
        let port = TestBinary.freePort()
        var settings = EndpointHealthSettings()
        settings.url = URL(string: "https://localhost:\(port)/apple/notifications")
        settings.caFile = certificates.ca
        settings.timeout = .seconds(120)
        let database = try await TestCluster.shared.makeDatabase()
        let registry = PrometheusCollectorRegistry()
        var alertSettings = AlertMonitor.Configuration()
        alertSettings.endpoint = settings

        // 1. The wrong name: the handshake fails chain verification for localhost.
        var h = try await Self.serve(wrongName, port: port, settings: settings, database: database)
        // A client of the test's own: each server closes its own when it stops.
        let client = PostgresClient(configuration: database)
        let running = Task { await client.run() }
        defer { running.cancel() }
        let logger = h.logs.logger()
        let checker = EndpointChecker(
            settings: settings, store: EndpointCheckStore(client: client, logger: logger), leases: LeaseStore(client: client, logger: logger), logger: logger,
            identity: "endpoint-test", metrics: EndpointMetrics(registry: registry))
        let monitor = AlertMonitor(configuration: alertSettings, store: AlertStore(client: client, logger: logger), logger: logger, identity: "endpoint-test")
        let t0 = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        let first = try await checker.runOnce(now: t0)
        guard case .checked(let report) = first else { Issue.record("not checked: \(first)"); return }
        #expect(report.failing == .tls, "\(report.findings)")
        #expect(report.findings.contains { $0.check == .tls && $0.level == .fail && $0.detail.contains("handshake with localhost:\(port) failed") }, "\(report.findings)")
        #expect(report.findings.contains { $0.check == .tls && $0.level == .warn && $0.detail.contains("also trusting") })
        #expect(try await checker.runOnce(now: t0.addingTimeInterval(60)) == .notDue(report), "the next check is an interval later")

        var fired = try await monitor.evaluate(now: t0)
        #expect(fired.map(\.kindAndType) == ["endpoint_unhealthy/tls"])
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(60)).isEmpty, "fires once")
        let open = try await AlertStore(client: client, logger: logger).open()
        #expect(open.count == 1)
        let tlsText = open.first.map { monitor.text($0.message) } ?? ""
        #expect(tlsText.contains("fails its tls check"), "\(tlsText)")

        var health = try await h.server.request(.GET, "/health")
        #expect(health.status == 200)
        #expect(health.json?["apple_revocations"] == .object(["waiting": .number(0), "discarded": .number(0)]), "\(health.body)")
        var endpoint = try #require(health.json?["endpoint"], "\(health.body)")
        #expect(endpoint["url"] == .string("https://localhost:\(port)/apple/notifications"))
        #expect(endpoint["status"] == .string("unhealthy") && endpoint["cause"] == .string("tls"), "\(health.body)")
        #expect(endpoint["checked_at"] == .string(iso8601(t0)))
        #expect(endpoint["certificate_expires_at"] == .null)
        let checks: [JSONValue] = endpoint["checks"]?.arrayValue ?? []
        let tls = checks.first { (check: JSONValue) -> Bool in check["check"]?.stringValue == "tls" && check["level"]?.stringValue == "fail" }
        #expect(tls?["detail"]?.stringValue?.contains("full chain verification") == true, "\(health.body)")
        #expect(!h.server.application.publicRouter().routes.contains { "\($0.path)" == "/health" }, "admin listener only")
        var text = Self.metrics(registry)
        #expect(text.contains("siwa_endpoint_healthy 0"), "\(text)")
        #expect(text.contains(#"siwa_endpoint_check_failed{check="tls"} 1"#))
        #expect(text.contains(#"siwa_endpoint_check_failed{check="route"} 1"#), "the route is checked with the same TLS")
        #expect(text.contains(#"siwa_endpoint_checks_total{outcome="failing"} 1"#))
        await h.stop()

        // 2. The right name, 3 days left: every check passes, but the certificate fires.
        h = try await Self.serve(expiring, port: port, settings: settings, database: database)
        let t1 = t0.addingTimeInterval(settings.interval.timeInterval)
        guard case .checked(let expiringReport) = try await checker.runOnce(now: t1) else { Issue.record("not checked"); return }
        #expect(expiringReport.failing == nil, "\(expiringReport.findings)")
        #expect(expiringReport.findings.contains { $0.check == .route && $0.level == .ok && $0.detail.contains("→ 400") })
        #expect(expiringReport.findings.contains { $0.check == .tls && $0.level == .warn && $0.detail.contains("the certificate expires in 2 days") })
        fired = try await monitor.evaluate(now: t1)
        #expect(fired.map(\.kindAndType) == ["endpoint_unhealthy/certificate"])
        #expect(try await monitor.evaluate(now: t1.addingTimeInterval(60)).isEmpty, "fires once")
        let certificate = try await AlertStore(client: client, logger: logger).open().first { $0.episode.key.type == "certificate" }
        let expiringText = certificate.map { monitor.text($0.message) } ?? ""
        #expect(expiringText.contains("expires in 2 days (threshold 14)"), "\(expiringText)")
        health = try await h.server.request(.GET, "/health")
        endpoint = try #require(health.json?["endpoint"], "\(health.body)")
        #expect(endpoint["status"] == .string("unhealthy") && endpoint["cause"] == .string("certificate"), "\(health.body)")
        #expect(endpoint["certificate_days_left"] == .number(2), "\(health.body)")
        text = Self.metrics(registry)
        #expect(text.contains("siwa_endpoint_healthy 0"))
        #expect(text.contains(#"siwa_endpoint_check_failed{check="tls"} 0"#))
        #expect(text.contains(#"siwa_endpoint_checks_total{outcome="expiring"} 1"#))
        let expiry = try #require(expiringReport.certificateExpiresAt)
        #expect(expiry > t1 && text.contains("siwa_endpoint_certificate_expiry_timestamp_seconds "), "\(text)")
        await h.stop()

        // 3. A renewed certificate: healthy, and both episodes resolve after the resolve delay.
        h = try await Self.serve(healthy, port: port, settings: settings, database: database)
        let t2 = t1.addingTimeInterval(settings.interval.timeInterval)
        guard case .checked(let healthyReport) = try await checker.runOnce(now: t2) else { Issue.record("not checked"); return }
        #expect(EndpointHealthRule.verdict(healthyReport, now: t2, certificateDays: settings.certificateDays) == .healthy, "\(healthyReport.findings)")
        // tls has been normal since t1 (an interval ago); certificate only since now.
        #expect(try await monitor.evaluate(now: t2).map(\.kindAndType) == ["endpoint_unhealthy/tls"])
        let resolved = try await monitor.evaluate(now: t2.addingTimeInterval(alertSettings.rules.spike.resolveAfter.timeInterval))
        #expect(resolved.map(\.kindAndType) == ["endpoint_unhealthy/certificate"])
        #expect(try await AlertStore(client: client, logger: logger).open().isEmpty)
        health = try await h.server.request(.GET, "/health")
        #expect(health.json?["endpoint"]?["status"] == .string("healthy"), "\(health.body)")
        #expect(health.json?["endpoint"]?["cause"] == .null)
        text = Self.metrics(registry)
        #expect(text.contains("siwa_endpoint_healthy 1"))
        #expect(text.contains(#"siwa_endpoint_checks_total{outcome="healthy"} 1"#))

        // Another process: not the lease holder, it only reports the stored result.
        let other = EndpointChecker(
            settings: settings, store: EndpointCheckStore(client: client, logger: logger), leases: LeaseStore(client: client, logger: logger), logger: logger,
            identity: "endpoint-other")
        #expect(try await other.runOnce(now: t2.addingTimeInterval(settings.interval.timeInterval)) == .notHolder(healthyReport))
        await h.stop()
    }

    @Test("endpoint health: without SIWA_PUBLIC_URL the admin /health says so; a CA file without the URL, or unreadable, stops start-up")
    func settings() async throws {
        let h = try await Harness.start()
        let health = try await h.server.request(.GET, "/health")
        #expect(health.status == 200 && health.json?["endpoint"] == .null, "\(health.body)")
        await h.stop()
        let aud = ["SIWA_APPLE_BUNDLE_IDS": Harness.aud]
        #expect(throws: ConfigurationError.self) {
            _ = try Configuration(SettingSource(environment: aud.merging(["SIWA_PUBLIC_URL_CA_FILE": "/etc/hostname"]) { $1 }))
        }
        do {
            _ = try Configuration(
                SettingSource(environment: aud.merging(["SIWA_PUBLIC_URL": "https://siwa.example.com/apple/notifications", "SIWA_PUBLIC_URL_CA_FILE": "/nonexistent.pem"]) { $1 }))
            Issue.record("an unreadable CA file was accepted")
        } catch {
            #expect("\(error)".hasPrefix("SIWA_PUBLIC_URL_CA_FILE") && "\(error)".contains("cannot read /nonexistent.pem as PEM certificates"), "\(error)")
        }
        let configured = try Configuration(
            SettingSource(environment: aud.merging(["SIWA_PUBLIC_URL": "https://siwa.example.com/apple/notifications", "SIWA_ALERT_CERTIFICATE_DAYS": "21"]) { $1 }))
        #expect(configured.alerts.endpoint.url?.absoluteString == "https://siwa.example.com/apple/notifications")
        #expect(configured.alerts.endpoint.certificateDays == 21)
        #expect(configured.alerts.endpoint.interval == .seconds(3 * 3600))
    }
}

extension AlertDecision {
    /// `kind/type` of what fired or resolved (tests).
    var kindAndType: String {
        switch self {
        case .none: "none"
        case .fire(let episode), .update(let episode), .join(let episode, _), .resolve(let episode, _):
            [episode.key.kind.rawValue, episode.key.type].compactMap { $0 }.joined(separator: "/")
        }
    }
}
