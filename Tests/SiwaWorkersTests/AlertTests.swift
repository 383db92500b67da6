import AsyncHTTPClient
import Foundation
import Logging
import NIOHTTP1
import PostgresNIO
import ServiceLifecycle
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// Alerts end to end: signed revocations through HTTP, the detector on the real database, the
/// messages at loopback sinks.
@Suite("Alerts: revocation spikes reach the sinks once per episode (one per app), firing, updated, resolved", .timeLimit(.minutes(10)))
struct AlertTests {
    /// Short settings: a 10 s window, 5 revocations fire an app without history.
    static func settings(window: Duration = .seconds(10)) -> SpikeSettings {
        var spike = SpikeSettings()
        spike.interval = .seconds(1)
        spike.window = window
        spike.minCount = 5
        spike.newAppCount = 5
        spike.resolveAfter = .seconds(1)
        return spike
    }

    static func monitor(_ e: EffectHarness, sinks: AlertSinks, window: Duration = .seconds(10)) -> AlertMonitor {
        var configuration = AlertMonitor.Configuration()
        configuration.rules.spike = settings(window: window)
        configuration.sinks = sinks
        return AlertMonitor(
            configuration: configuration, store: AlertStore(client: e.client, logger: e.h.logs.logger()), logger: e.h.logs.logger(),
            identity: e.workers.identity)
    }

    static func bodies(_ endpoint: CallbackEndpoint) -> [JSONValue] {
        endpoint.received.compactMap { JSONValue.parse(Data($0.body)) }
    }

    /// Posts `count` revocations of `type` at once (a loaded CI machine must not spread them past
    /// the window).
    static func burst(_ e: EffectHarness, _ type: String, count: Int, prefix: String) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<count { group.addTask { try await e.post(type, sub: "\(prefix)-\(index)", at: Int64(index)) } }
            try await group.waitForAll()
        }
    }

    /// The webhook messages received so far: webhook-id and body.
    static func messages(_ endpoint: CallbackEndpoint) -> [(id: String, body: JSONValue)] {
        endpoint.received.compactMap { request in JSONValue.parse(Data(request.body)).map { (request.headers["webhook-id"] ?? "", $0) } }
    }

    @Test("a burst of consent-revoked through HTTP crosses two series and pages once: one firing naming both (webhook, signed, and Slack), one resolved")
    func burstFiresAndResolves() async throws {
        let webhook = try await CallbackEndpoint.start()
        let slack = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], slack: slack.url, signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { $0.lanes.alertSinks = sinks }
        let monitor = Self.monitor(e, sinks: sinks, window: .seconds(60))

        try await Self.burst(e, "consent-revoked", count: 8, prefix: "burst")
        try await e.post("email-disabled", sub: "quiet", at: 1, email: "q@privaterelay.appleid.com")  // not a revocation
        // The evaluator is driven here, at chosen times (the clock passed in), not by its loop.
        let t0 = Date()
        let fired = try await monitor.evaluate(now: t0)
        #expect(fired.count == 1, "one episode for the app, not one per series: \(fired)")
        guard case .fire(let episode) = fired.first else {
            Issue.record("expected one firing: \(fired)")
            return
        }
        #expect(episode.key == AlertKey(kind: .revocationSpike, aud: Harness.aud))
        #expect(episode.series == ["consent-revoked", "revocations"], "both series crossed on the 8")
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(1)).isEmpty, "the same burst evaluated again tells nobody")
        #expect(try await e.deliverAlerts() == 2, "one message per sink")

        let firing = Self.messages(webhook)
        #expect(firing.count == 1, "\(firing)")
        let body = try #require(firing.first?.body)
        #expect(body["kind"] == .string("revocation_spike"))
        #expect(body["state"] == .string("firing"))
        #expect(body["aud"] == .string(Harness.aud))
        #expect(body["type"] == .null)
        #expect(body["series"] == .array([.string("consent-revoked"), .string("revocations")]))
        #expect(body["count"] == .number(8))
        #expect(body["window"] == .number(60))
        #expect(body["baseline"] == .null, "a new app has no baseline")
        #expect(body["resolved_at"] == .null)
        let id = try #require(body["id"]?.numberValue.map { Int($0) })
        #expect(firing.first?.id == "alert_\(id)_firing")
        #expect(webhook.received.allSatisfy { TestWebhooks.verifies($0, secret: TestWebhooks.secret) })
        #expect(slack.received.count == 1)
        #expect(slack.received.allSatisfy { $0.headers["webhook-signature"] == nil })
        let text = try #require(Self.bodies(slack).first?["text"]?.stringValue)
        #expect(text.contains("FIRING") && text.contains("consent-revoked, revocations (consent-revoked + account-delete)"), "\(text)")

        // The burst leaves the 60 s window; once normal for the resolve delay (1 s), one resolve.
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(70)).isEmpty, "normal since now: waiting out resolve-after")
        let resolved = try await monitor.evaluate(now: t0.addingTimeInterval(72))
        #expect(resolved.count == 1, "\(resolved)")
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(80)).isEmpty)
        #expect(try await e.deliverAlerts() == 2)
        let all = Self.messages(webhook)
        #expect(all.count == 2, "\(all.map(\.body))")
        let last = try #require(all.last?.body)
        #expect(last["state"] == .string("resolved") && last["resolved_at"]?.stringValue != nil && last["count"] == .number(8))
        #expect(last["id"] == .number(Double(id)), "the resolved message carries the firing alert's id")
        #expect(last["series"] == body["series"])
        #expect(all.last?.id == "alert_\(id)_resolved")
        #expect(slack.received.count == 2)
        #expect(try await e.h.count("SELECT count(*) FROM alerts WHERE kind = 'revocation_spike'") == 1)
        #expect(!e.h.logs.all.filter { $0.contains("alert: 🔴 FIRING") }.isEmpty, "the log is always a sink")

        // /v1/alerts lists the one episode with its series.
        let reader = try await API.token(e.h, [.alertsRead])
        let listed = try await API.call(e.h, .GET, "/v1/alerts", token: reader)
        let items = listed.json?["items"]?.arrayValue ?? []
        #expect(items.count == 1, "\(items)")
        #expect(items.first?["series"] == .array([.string("consent-revoked"), .string("revocations")]))
        #expect(items.first?["state"] == .string("resolved"))

        await e.stop()
        await webhook.stop()
        await slack.stop()
    }

    @Test("an account-delete spike joining an open consent-revoked episode: one updated message naming it, then one resolve for all")
    func secondTypeJoins() async throws {
        let webhook = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { $0.lanes.alertSinks = sinks }
        let monitor = Self.monitor(e, sinks: sinks, window: .seconds(60))

        try await Self.burst(e, "consent-revoked", count: 6, prefix: "revoked")
        let t0 = Date()
        #expect(try await monitor.evaluate(now: t0).count == 1)
        // Delivered step by step: one batch's deliveries run concurrently, in no fixed order.
        #expect(try await e.deliverAlerts() == 1)
        try await Self.burst(e, "account-delete", count: 6, prefix: "deleted")
        let t1 = max(Date(), t0.addingTimeInterval(1))
        let joined = try await monitor.evaluate(now: t1)
        #expect(joined.count == 1, "\(joined)")
        guard case .join(let episode, let series) = joined.first else {
            Issue.record("expected account-delete to join the open episode: \(joined)")
            return
        }
        #expect(series == ["account-delete"])
        #expect(episode.series == ["consent-revoked", "account-delete", "revocations"])
        #expect(try await monitor.evaluate(now: t1.addingTimeInterval(1)).isEmpty, "a series joins once")
        #expect(try await e.deliverAlerts() == 1)
        #expect(try await monitor.evaluate(now: t1.addingTimeInterval(70)).isEmpty)
        #expect(try await monitor.evaluate(now: t1.addingTimeInterval(72)).count == 1)
        #expect(try await e.deliverAlerts() == 1)

        let messages = Self.messages(webhook)
        #expect(messages.map { $0.body["state"]?.stringValue } == ["firing", "updated", "resolved"], "\(messages.map(\.body))")
        let id = try #require(messages.first?.body["id"]?.numberValue.map { Int($0) })
        #expect(messages.map(\.id) == ["alert_\(id)_firing", "alert_\(id)_updated_3", "alert_\(id)_resolved"], "one webhook-id per message")
        #expect(messages.allSatisfy { $0.body["id"] == .number(Double(id)) })
        let updated = try #require(messages.dropFirst().first?.body)
        #expect(updated["joined"] == .array([.string("account-delete")]))
        #expect(updated["series"] == .array([.string("consent-revoked"), .string("account-delete"), .string("revocations")]))
        #expect(updated["count"] == .number(12), "the figures follow the largest crossing count (the sum)")
        #expect(webhook.received.allSatisfy { TestWebhooks.verifies($0, secret: TestWebhooks.secret) })

        let reader = try await API.token(e.h, [.alertsRead])
        let items = try await API.call(e.h, .GET, "/v1/alerts?state=resolved", token: reader).json?["items"]?.arrayValue ?? []
        #expect(items.count == 1)
        #expect(items.first?["series"] == updated["series"])
        await e.stop()
        await webhook.stop()
    }

    @Test("upgrade: alerts open from before episodes (one row per series) each resolve once, page nobody again, and the next burst is one episode")
    func upgradeFromPerSeriesAlerts() async throws {
        let database = try await TestCluster.shared.makeEmptyDatabase()
        // The schema as it was before episodes, with what today's main wrote for one burst: two
        // open alerts, one per series, each told to the sinks already.
        let client = PostgresClient(configuration: database)
        let logger = Logger(label: "upgrade", factory: { _ in SwiftLogNoOpLogHandler() })
        var old: [Int] = []
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            try await Migrator(client: client, migrations: Migration.all.filter { $0.version <= 10 }, logger: logger).migrate()
            for type in ["consent-revoked", "revocations"] {
                for try await (id,) in try await client.query(
                    """
                    INSERT INTO alerts (kind, aud, type, state, started_at, window_seconds, value, peak, threshold)
                    VALUES ('revocation_spike', \(Harness.aud), \(type), 'firing', now() - interval '1 minute', 60, 8, 8, 5) RETURNING id
                    """
                ).decode((Int,).self) {
                    old.append(id)
                }
            }
            group.cancelAll()
        }
        let webhook = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let h = try await Harness.start(database: database)  // migrates forward
        var configuration = EffectWorkers.Configuration()
        configuration.effects.workers = 1
        configuration.lanes.alertSinks = sinks
        let e = EffectHarness(h: h, workers: EffectWorkers(configuration: configuration, store: EffectStore(client: h.server.client, logger: h.logs.logger()), logger: h.logs.logger()))
        let monitor = Self.monitor(e, sinks: sinks, window: .seconds(60))

        // The burst goes on: its series are the old alerts', so no new episode pages for it.
        try await Self.burst(e, "consent-revoked", count: 8, prefix: "ongoing")
        let t0 = Date()
        #expect(try await monitor.evaluate(now: t0).isEmpty, "the old alerts still cover their series")
        #expect(try await e.deliverAlerts() == 0)
        // Over: each old alert resolves, once.
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(70)).isEmpty)
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(72)).count == 2)
        #expect(try await monitor.evaluate(now: t0.addingTimeInterval(80)).isEmpty)
        #expect(try await e.deliverAlerts() == 2)
        let resolved = Self.messages(webhook)
        #expect(Set(resolved.map(\.id)) == Set(old.map { "alert_\($0)_resolved" }), "\(resolved.map(\.body))")
        #expect(Set(resolved.compactMap { $0.body["type"]?.stringValue }) == ["consent-revoked", "revocations"])
        #expect(resolved.allSatisfy { $0.body["series"] == .array([$0.body["type"] ?? .null]) })

        // The next burst (the old one is still in the real window: 16 now) is one episode.
        try await Self.burst(e, "consent-revoked", count: 8, prefix: "next")
        let fired = try await monitor.evaluate(now: max(Date(), t0.addingTimeInterval(1)))
        #expect(fired.count == 1, "\(fired)")
        #expect(try await e.deliverAlerts() == 1)
        let next = try #require(Self.messages(webhook).last?.body)
        #expect(next["state"] == .string("firing") && next["type"] == .null)
        #expect(next["series"] == .array([.string("consent-revoked"), .string("revocations")]))
        await e.stop()
        await webhook.stop()
    }

    @Test("a sink message the database refuses fails the alert's transaction loudly: no alert row without its messages")
    func refusedMessageIsAnError() async throws {
        let e = try await EffectHarness.start()
        try await e.client.query(
            """
            CREATE FUNCTION refuse_alert_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.lane = 'alerts' THEN RAISE EXCEPTION 'no alert jobs today'; END IF; RETURN NEW; END $$
            """)
        try await e.client.query("CREATE TRIGGER refuse_alert_jobs BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_alert_jobs()")
        let store = AlertStore(client: e.client, logger: e.h.logs.logger())
        let message = SinkMessage(target: "https://hooks.example.com/a", kind: "webhook", body: "{}")
        await #expect(throws: PSQLError.self) { _ = try await store.test(window: .seconds(10), sinks: { _ in [message] }) }
        #expect(try await e.h.count("SELECT count(*) FROM alerts") == 0)
        try await e.client.query("DROP TRIGGER refuse_alert_jobs ON jobs")
        _ = try await store.test(window: .seconds(10), sinks: { _ in [message] })
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'alerts'") == 1)
        await e.stop()
    }

    @Test("silenced: the alert is recorded and listed as silenced, no sink hears of it; GET /v1/alerts needs alerts:read")
    func silencedAndListed() async throws {
        let webhook = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { $0.lanes.alertSinks = sinks }
        // A window of 10 minutes: this case is about silencing, and a slowed CI machine once took
        // more than 10 s to deliver the six, so the first left a 10 s window before evaluation.
        let monitor = Self.monitor(e, sinks: sinks, window: .seconds(600))
        _ = try await AlertSilenceStore(client: e.client, logger: e.h.logs.logger()).silence(kind: .revocationSpike, aud: Harness.aud, for: .seconds(3600), by: "test", reason: "planned cleanup")
        for index in 0..<6 { try await e.post("account-delete", sub: "gone-\(index)", at: Int64(index)) }
        let decisions = try await monitor.evaluate(now: Date())
        #expect(decisions.count == 1, "one episode (account-delete and revocations) fires, silenced, on the six: \(decisions)")
        #expect(try await e.deliverAlerts() == 0)
        #expect(webhook.received.isEmpty)
        // A later evaluation does not open a second episode; a second type joining it is recorded,
        // told to nobody either.
        #expect(try await monitor.evaluate(now: Date()).isEmpty)
        for index in 0..<6 { try await e.post("consent-revoked", sub: "revoked-\(index)", at: Int64(index)) }
        let joined = try await monitor.evaluate(now: Date())
        #expect(joined.count == 1, "consent-revoked joins the silenced episode: \(joined)")
        #expect(try await e.deliverAlerts() == 0)
        #expect(webhook.received.isEmpty)

        let reader = try await API.token(e.h, [.alertsRead])
        let listed = try await API.call(e.h, .GET, "/v1/alerts?state=firing", token: reader)
        #expect(listed.status == 200)
        let items = listed.json?["items"]?.arrayValue ?? []
        #expect(items.count == 1)
        #expect(items.allSatisfy { $0["silenced"] == .bool(true) && $0["series"] == .array(RevocationSeries.all.map(JSONValue.string)) })
        #expect(listed.json?["silences"]?.arrayValue?.first?["reason"] == .string("planned cleanup"))
        let other = try await API.token(e.h, [.notificationsRead])
        #expect(try await API.call(e.h, .GET, "/v1/alerts", token: other).status == 403)
        #expect(try await API.call(e.h, .GET, "/v1/alerts?state=open", token: reader).status == 400)
        await e.stop()
        await webhook.stop()
    }

    @Test("`siwa-events alerts test` (the real binary) reaches every sink through a running worker, and says so; without sinks it says what to set")
    func alertsTestCommand() async throws {
        let webhook = try await CallbackEndpoint.start()
        let slack = try await CallbackEndpoint.start()
        let database = try await TestCluster.shared.makeDatabase()
        let client = PostgresClient(configuration: database)
        let logger = Logger(label: "alerts-test", factory: { _ in SwiftLogNoOpLogHandler() })
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        // Alerts and callbacks configured side by side: each has its own secret.
        let alertSecret = WebhookSigner.generateSecret()
        let environment = [
            "DATABASE_URL": "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)",
            "SIWA_ALERT_WEBHOOK_URLS": webhook.url.absoluteString, "SIWA_ALERT_SLACK_URL": slack.url.absoluteString,
            "SIWA_ALERT_SECRET": alertSecret, "SIWA_CALLBACK_URL": "http://127.0.0.1:9/unused", "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
        ]
        var configuration = try EffectWorkers.Configuration(SettingSource(environment: environment))
        configuration.effects.workers = 1
        let workers = EffectWorkers(configuration: configuration, store: EffectStore(client: client, logger: logger), logger: logger)
        let group = ServiceGroup(configuration: .init(services: [client, workers], logger: logger))
        let running = Task { try await group.run() }

        let result = try await TestBinary.run(["alerts", "test", "--wait", "20s"], environment: environment, directory: "/tmp")
        #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
        #expect(result.stdout.split(separator: "\n").filter { $0.contains("delivered (HTTP 200)") }.count == 2, "\(result.stdout)")
        let body = try #require(webhook.received.first.flatMap { JSONValue.parse(Data($0.body)) })
        #expect(body["kind"] == .string("test"))
        #expect(webhook.received.allSatisfy { TestWebhooks.verifies($0, secret: alertSecret) })
        #expect(!webhook.received.contains { TestWebhooks.verifies($0, secret: TestWebhooks.secret) })
        #expect(slack.received.first?.bodyText.contains("this sink works") == true)

        let none = try await TestBinary.run(["alerts", "test"], environment: ["DATABASE_URL": environment["DATABASE_URL"]!], directory: "/tmp")
        #expect(none.status == 78)
        #expect(none.stderr.contains("SIWA_ALERT_WEBHOOK_URLS"))

        await group.triggerGracefulShutdown()
        _ = await running.result
        await webhook.stop()
        await slack.stop()
    }

    @Test("bad_signatures: forged tokens through HTTP fire it; a sink answering 500 is retried under the same id while detection goes on; delivered once the sink recovers")
    func badSignaturesWithFailingSink() async throws {
        let webhook = try await CallbackEndpoint.start()
        webhook.answer([500, 500])  // the sink fails twice, then recovers
        let sinks = AlertSinks(webhooks: [webhook.url], slack: nil, signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { configuration in
            configuration.lanes.alertSinks = sinks
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once: no waiting on time
        }
        var configuration = AlertMonitor.Configuration()
        configuration.rules.spike = Self.settings()
        configuration.sinks = sinks
        configuration.rules.badSignatures = 3
        let monitor = AlertMonitor(
            configuration: configuration, store: AlertStore(client: e.client, logger: e.h.logs.logger()), logger: e.h.logs.logger(),
            identity: e.workers.identity)

        let impostor = try AppleStyleSigner.generate()
        for index in 0..<4 {
            let forged = try impostor.sign(
                header: .object(["kid": .string(e.h.signer.kid), "alg": .string("RS256")]),
                claims: AppleStyleSigner.claims(aud: Harness.aud, type: "account-delete", sub: "forged-\(index)", eventTime: Date(), issuedAt: Date()))
            #expect(try await e.h.server.post(jws: forged).json?["reason"] == .string("bad_signature"))
        }
        await e.h.flushRejections()
        let t0 = Date()
        let fired = try await monitor.evaluate(now: t0)
        #expect(fired.contains { if case .fire(let episode) = $0 { episode.key.kind == .badSignatures } else { false } }, "\(fired)")
        #expect(try await e.deliverAlerts() == 1)
        #expect(webhook.received.map(\.status) == [500])
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'alerts' AND state = 'retryable'") == 1)

        // Detection is not held up by the failing sink: a revocation spike fires meanwhile.
        try await Self.burst(e, "consent-revoked", count: 6, prefix: "meanwhile")
        // Judged after the burst's last commit (under load it may take longer than a second).
        let next = try await monitor.evaluate(now: max(Date(), t0.addingTimeInterval(1)))
        #expect(next.contains { if case .fire(let episode) = $0 { episode.key.kind == .revocationSpike } else { false } }, "\(next)")
        // The sink fails once more, then takes both messages; the retried one keeps its webhook-id.
        _ = try await e.deliverAlerts()
        _ = try await e.deliverAlerts()
        let received = webhook.received
        #expect(received.filter { $0.status == 200 }.count == 2, "\(received.map(\.status))")
        let ids = received.map { $0.headers["webhook-id"] ?? "" }
        let badSignatureID = try #require(ids.first)
        #expect(ids.filter { $0 == badSignatureID }.count == received.filter { JSONValue.parse(Data($0.body))?["kind"] == .string("bad_signatures") }.count)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'alerts' AND state = 'completed'") == 2)
        await e.stop()
        await webhook.stop()
    }

    @Test("operational: a discarded job and a lagging queue fire their own alerts and resolve when cleared")
    func operational() async throws {
        let e = try await EffectHarness.start { $0.queue.maxAttempts = 1 }
        // A ten-minute window: the discarded job counts at the evaluation five minutes on.
        let monitor = Self.monitor(e, sinks: AlertSinks(), window: .seconds(600))
        // The database refuses this user's account row: the effect fails, and with one attempt allowed it is discarded.
        try await e.client.query(
            """
            CREATE FUNCTION refuse_op() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.sub = 'op' THEN RAISE EXCEPTION 'refused for the test'; END IF; RETURN NEW; END $$
            """)
        try await e.client.query("CREATE TRIGGER refuse_op BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refuse_op()")
        try await e.post("consent-revoked", sub: "op", at: 1)
        #expect(try await e.drain() == 1)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'effects' AND state = 'discarded'") == 1)
        // Three jobs ready now, nobody taking them: evaluated five minutes on, the queue lags.
        try await BulkLoad.notifications(count: 3, users: 3, aud: "com.example.other", client: e.client)
        let now = Date().addingTimeInterval(300)
        let fired = try await monitor.evaluate(now: now)
        let kinds = fired.compactMap { decision -> String? in if case .fire(let episode) = decision { episode.key.kind.rawValue } else { nil } }
        #expect(Set(kinds) == ["jobs_discarded", "queue_lag"])
        // Cleared: the ready jobs applied, and the discard older than the window.
        #expect(try await e.drain(now: now) == 3)
        #expect(try await monitor.evaluate(now: now.addingTimeInterval(601)).isEmpty)  // normal since then: waiting out resolve-after
        let resolved = try await monitor.evaluate(now: now.addingTimeInterval(603))
        #expect(resolved.count == 2)
        #expect(resolved.allSatisfy { if case .resolve = $0 { true } else { false } })
        await e.stop()
    }

    @Test("transfer_deadline: fires once at 14 days left while users remain, tells the sinks again at the last 3, resolves when every user migrated; no alert without users left")
    func transferDeadline() async throws {
        let webhook = try await CallbackEndpoint.start()
        let sinks = AlertSinks(webhooks: [webhook.url], signer: try WebhookSigner(secrets: TestWebhooks.secret))
        let e = try await EffectHarness.start { $0.lanes.alertSinks = sinks }
        // The clock jumps days ahead: messages queued at real time must not count as queue lag.
        var configuration = Self.monitor(e, sinks: sinks).configuration
        configuration.rules.queueLag = .seconds(365 * 86_400)
        let monitor = AlertMonitor(configuration: configuration, store: AlertStore(client: e.client, logger: e.h.logs.logger()), logger: e.h.logs.logger(), identity: "test")
        let transfers = TransferStore(client: e.client, logger: e.h.logs.logger())
        for index in 0..<5 { try await e.client.query("INSERT INTO accounts (aud, sub) VALUES (\(Harness.aud), \("001.deadline.\(index)"))") }
        // Transferred 45 days and a half ago: 15 days left (the day under way counted), 14 in half a
        // day, 3 eleven days later.
        let t0 = Date()
        let outgoing = try await transfers.start(
            .outgoing, clientID: Harness.aud, aud: Harness.aud, teamID: "TEAMB23456", transferredAt: t0.addingTimeInterval(-45.5 * 86_400), actor: "test")
        #expect(try await transfers.listUsers(of: outgoing) == 5)
        // Two transfers that need nothing: one whose only user Apple refused, one received with nothing imported.
        try await e.client.query("INSERT INTO accounts (aud, sub) VALUES ('com.example.other', '001.refused.1')")
        let refused = try await transfers.start(
            .outgoing, clientID: "com.example.other", aud: "com.example.other", teamID: "TEAMC34567", transferredAt: t0.addingTimeInterval(-58 * 86_400),
            actor: "test")
        try await transfers.listUsers(of: refused)
        try await transfers.record(.failure(TransferFailure(word: "invalid_request")), sub: "001.refused.1", of: refused)
        _ = try await transfers.start(
            .incoming, clientID: Harness.aud, aud: Harness.aud, teamID: "TEAMD45678", transferredAt: t0.addingTimeInterval(-58 * 86_400), actor: "test")

        func transferDecisions(at now: Date) async throws -> [AlertDecision] {
            try await monitor.evaluate(now: now).filter { decision in
                switch decision {
                case .fire(let episode), .update(let episode), .join(let episode, _), .resolve(let episode, _): episode.key.kind == .transferDeadline
                case .none: false
                }
            }
        }
        #expect(try await transferDecisions(at: t0).isEmpty, "15 days left: not yet")
        let fired = try await transferDecisions(at: t0.addingTimeInterval(43_200 + 60))
        guard case .fire(let episode) = fired.first, fired.count == 1 else {
            Issue.record("expected one firing: \(fired)")
            return
        }
        #expect(episode.key == AlertKey(kind: .transferDeadline, aud: Harness.aud, type: "to TEAMB23456"))
        #expect(episode.value == 5 && episode.threshold == 14 && episode.series == ["deadline"])
        #expect(try await transferDecisions(at: t0.addingTimeInterval(86_400)).isEmpty, "evaluated again: nobody told twice")
        #expect(try await e.deliverAlerts() == 1)

        // Two users migrated, then the last days: told again, naming last_days.
        for index in 0..<2 { try await transfers.record(.success("st1.\(index)"), sub: "001.deadline.\(index)", of: outgoing) }
        let last = try await transferDecisions(at: t0.addingTimeInterval(12 * 86_400))
        guard case .join(let joined, let series) = last.first, last.count == 1 else {
            Issue.record("expected one update: \(last)")
            return
        }
        #expect(series == ["last_days"] && joined.value == 3 && joined.threshold == 3)
        #expect(try await transferDecisions(at: t0.addingTimeInterval(12 * 86_400 + 60)).isEmpty)
        #expect(try await e.deliverAlerts() == 1)

        // Every user migrated: resolved.
        for index in 2..<5 { try await transfers.record(.success("st1.\(index)"), sub: "001.deadline.\(index)", of: outgoing) }
        let resolved = try await transferDecisions(at: t0.addingTimeInterval(12 * 86_400 + 120))
        #expect(resolved.count == 1 && { if case .resolve = resolved.first { true } else { false } }(), "\(resolved)")
        #expect(try await e.deliverAlerts() == 1)

        let bodies = Self.messages(webhook).map(\.body)
        #expect(bodies.map { $0["state"]?.stringValue ?? "" } == ["firing", "updated", "resolved"], "\(bodies)")
        #expect(bodies.allSatisfy { $0["kind"] == .string("transfer_deadline") && $0["aud"] == .string(Harness.aud) && $0["type"] == .string("to TEAMB23456") })
        #expect(bodies.map { $0["count"] } == [.number(5), .number(5), .number(5)], "count is the peak: the users left when it fired")
        #expect(bodies[1]["joined"] == .array([.string("last_days")]))
        let logs = e.h.logs.all.filter { $0.contains("[transfer_deadline]") }
        #expect(logs.contains { $0.contains("5 users not migrated with 14 days or fewer left") }, "\(logs)")
        #expect(logs.contains { $0.contains("3 users not migrated with 3 days or fewer left") }, "\(logs)")
        #expect(logs.contains { $0.contains("RESOLVED") && $0.contains("every user migrated") }, "\(logs)")
        #expect(try await e.h.count("SELECT count(*) FROM alerts WHERE kind = 'transfer_deadline'") == 1)
        await e.stop()
        await webhook.stop()
    }
}
