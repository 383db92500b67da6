import Foundation
import PostgresNIO
import Prometheus
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// An alert rule declared by this test target alone (no edit under Sources/, no migration), run
/// by the real monitor on a real database beside the built-in rules: it fires, grows, resolves and
/// is silenced like them, and no other monitor knows of it.
@Suite("An alert rule declared outside Sources/ runs like the built-in ones", .timeLimit(.minutes(10)))
struct DeclaredAlertRuleTests {
    /// Exports waiting in a table of this test's own: one episode while any waits, each export a
    /// series; another export waiting tells the sinks again, and the episode resolves once none
    /// waits.
    struct WaitingExports: MonitoredAlertRule {
        let kind = AlertKind("waiting_exports")

        func observe(_ source: AlertSource, now: Date) async throws -> [String] {
            var names: [String] = []
            for try await (name,) in try await source.client.query("SELECT name FROM waiting_exports ORDER BY name", logger: source.logger)
                .decode((String,).self)
            {
                names.append(name)
            }
            return names
        }

        func step(_ names: [String], open: [AlertEpisode], now: Date) -> [AlertDecision] {
            let key = AlertKey(kind: kind)
            guard var episode = open.first(where: { $0.key == key }) else {
                guard !names.isEmpty else { return [] }
                return [.fire(AlertEpisode(key: key, series: names, startedAt: now, value: names.count, peak: names.count, baseline: nil, threshold: 1))]
            }
            guard !names.isEmpty else { return [.resolve(episode, at: now)] }
            let joined = names.filter { !episode.series.contains($0) }
            guard !joined.isEmpty else { return [] }
            episode.series += joined
            episode.value = names.count
            episode.peak = max(episode.peak, names.count)
            return [.join(episode, series: joined)]
        }

        func subject(_ message: AlertMessage) -> String {
            "\(message.episode.peak) exports waiting (\(message.series.joined(separator: ", "))): see the export runner"
        }
    }

    static func verb(_ decisions: [AlertDecision]) -> [String] {
        decisions.compactMap { decision in
            switch decision {
            case .fire(let episode): "fire \(episode.key) \(episode.series)"
            case .join(let episode, let joined): "join \(episode.key) \(joined)"
            case .update(let episode): "update \(episode.key)"
            case .resolve(let episode, _): "resolve \(episode.key)"
            case .none: nil
            }
        }
    }

    @Test("fires, tells the sinks again when another series joins, resolves; silenced by its kind, the sinks hear nothing; other monitors leave it alone")
    func lifecycle() async throws {
        let webhook = try await CallbackEndpoint.start()
        let slack = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], slack: slack.url, signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { $0.lanes.alertSinks = sinks }
        let logger = e.h.logs.logger()
        try await e.client.query("CREATE TABLE waiting_exports (name text PRIMARY KEY)", logger: logger)
        var configuration = AlertMonitor.Configuration()
        configuration.sinks = sinks
        configuration.declared = [WaitingExports()]
        let registry = PrometheusCollectorRegistry()
        let monitor = AlertMonitor(
            configuration: configuration, store: AlertStore(client: e.client, logger: logger), logger: logger, identity: "declared",
            metrics: AlertMetrics(registry: registry))
        #expect(monitor.configuration.registered.map(\.kind.rawValue).suffix(2) == ["quiet_app", "waiting_exports"], "after the built-in rules")
        let t0 = Date()
        func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }

        // Fires: one message per sink, in the rule's words.
        try await e.client.query("INSERT INTO waiting_exports VALUES ('nightly')", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(0))) == [#"fire waiting_exports ["nightly"]"#])
        #expect(try await monitor.evaluate(now: at(1)).isEmpty, "the same export again tells nobody")
        #expect(try await e.deliverAlerts() == 2)
        var exposition: [UInt8] = []
        registry.emit(into: &exposition)
        #expect(String(decoding: exposition, as: UTF8.self).contains(#"siwa_alerts_firing{kind="waiting_exports"} 1"#))
        let firing = try #require(webhook.received.first.flatMap { JSONValue.parse(Data($0.body)) })
        #expect(firing["kind"] == .string("waiting_exports") && firing["state"] == .string("firing") && firing["series"] == .array([.string("nightly")]))
        let id = try #require(firing["id"]?.numberValue.map { Int($0) })
        #expect(webhook.received.first?.headers["webhook-id"] == "alert_\(id)_firing")
        let text = slack.received.first.flatMap { JSONValue.parse(Data($0.body))?["text"]?.stringValue } ?? ""
        #expect(text.hasPrefix("🔴 FIRING [waiting_exports] 1 exports waiting (nightly): see the export runner"), "\(text)")

        // A monitor of the built-in rules alone (another test's, another process's) leaves it open.
        let plain = AlertMonitor(configuration: .init(), store: AlertStore(client: e.client, logger: logger), logger: logger, identity: "plain")
        #expect(try await plain.evaluate(now: at(2)).isEmpty)

        // Another series joins: told as updated; then none waits: resolved.
        try await e.client.query("INSERT INTO waiting_exports VALUES ('weekly')", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(3))) == [#"join waiting_exports ["weekly"]"#])
        #expect(try await e.deliverAlerts() == 2)
        try await e.client.query("DELETE FROM waiting_exports", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(4))) == ["resolve waiting_exports"])
        #expect(try await e.deliverAlerts() == 2)
        let bodies = webhook.received.compactMap { JSONValue.parse(Data($0.body)) }
        #expect(bodies.map { $0["state"]?.stringValue ?? "" } == ["firing", "updated", "resolved"], "\(bodies)")
        #expect(bodies[1]["joined"] == .array([.string("weekly")]) && bodies[2]["series"] == .array([.string("nightly"), .string("weekly")]))
        #expect(webhook.received.map { $0.headers["webhook-id"] ?? "" } == ["alert_\(id)_firing", "alert_\(id)_updated_2", "alert_\(id)_resolved"])
        #expect(e.h.logs.all.contains { $0.contains("✅ RESOLVED [waiting_exports] 2 exports waiting (nightly, weekly)") })

        // Silenced by its kind (what `alerts silence --kind` writes): recorded, the sinks told nothing.
        _ = try await AlertSilenceStore(client: e.client, logger: logger).silence(kind: AlertKind("waiting_exports"), aud: nil, for: .seconds(3600), by: "test", reason: "backfill")
        try await e.client.query("INSERT INTO waiting_exports VALUES ('monthly')", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(5))) == [#"fire waiting_exports ["monthly"]"#])
        try await e.client.query("INSERT INTO waiting_exports VALUES ('yearly')", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(6))) == [#"join waiting_exports ["yearly"]"#])
        try await e.client.query("DELETE FROM waiting_exports", logger: logger)
        #expect(Self.verb(try await monitor.evaluate(now: at(7))) == ["resolve waiting_exports"])
        #expect(try await e.deliverAlerts() == 0)
        #expect(webhook.received.count == 3 && slack.received.count == 3)
        let stored = try await AlertStore(client: e.client, logger: logger).list(state: nil, limit: 10).filter { $0.episode.key.kind.rawValue == "waiting_exports" }
        #expect(stored.map { $0.silencedBy != nil } == [true, false] && stored.allSatisfy { $0.state == "resolved" })
        #expect(e.h.logs.all.contains { $0.contains("[waiting_exports] 1 exports waiting (monthly)") && $0.contains("silenced=true") })

        await e.stop()
        await webhook.stop()
        await slack.stop()
    }
}
