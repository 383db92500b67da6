import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import ServiceLifecycle
import SiwaApp
import SiwaDomain
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// Callbacks through real HTTP to a loopback endpoint, on a real database.
@Suite("Callbacks: the backend is told about each effect, signed, retried, never in the effects' way", .timeLimit(.minutes(10)))
struct CallbackTests {

    static func harness(_ endpoint: CallbackEndpoint, secrets: String = TestWebhooks.secret, _ configure: (inout EffectWorkers.Configuration) -> Void = { _ in })
        async throws -> EffectHarness
    {
        try await EffectHarness.start { configuration in
            configuration.lanes.callbacks = .init(url: endpoint.url, signer: try! WebhookSigner(secrets: secrets))
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
            configure(&configuration)
        }
    }

    @Test("after an effect: one signed POST with the effect's facts; a 500 is retried with the same webhook-id and a fresh signature")
    func deliveredAndRetried() async throws {
        let endpoint = try await CallbackEndpoint.start()
        let e = try await Self.harness(endpoint, secrets: "\(TestWebhooks.rotated) \(TestWebhooks.secret)")
        _ = try await e.session(sub: "cb1", createdAt: 1_000)
        try await e.post("consent-revoked", sub: "cb1", at: 5_000, jti: "cb-jti-1")
        #expect(try await e.drain() == 1)
        endpoint.answer([500])
        #expect(try await e.deliverCallbacks() == 1)  // answered 500
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'retryable' AND last_status = 500") == 1)
        #expect(try await e.deliverCallbacks() == 1)  // answered 200
        #expect(try await e.deliverCallbacks() == 0)

        let received = endpoint.received
        #expect(received.count == 2)
        #expect(received.map(\.status) == [500, 200])
        for request in received {
            #expect(TestWebhooks.verifies(request, secret: TestWebhooks.secret))
            #expect(TestWebhooks.verifies(request, secret: TestWebhooks.rotated))
            #expect(!TestWebhooks.verifies(request, secret: "whsec_" + Data(repeating: 1, count: 32).base64EncodedString()))
            #expect(request.headers["content-type"] == "application/json")
            let sent = try #require(Int64(request.headers["webhook-timestamp"] ?? ""))
            #expect(abs(Double(sent) - Date().timeIntervalSince1970) < 120)
        }
        #expect(received[0].headers["webhook-id"] == received[1].headers["webhook-id"])
        #expect(received[0].bodyText == received[1].bodyText)
        let body = try #require(JSONValue.parse(Data(received[1].body)))
        #expect(body["type"] == .string("consent-revoked"))
        #expect(body["aud"] == .string(Harness.aud))
        #expect(body["sub"] == .string("cb1"))
        #expect(body["jti"] == .string("cb-jti-1"))
        #expect(body["event_time"] == .string(iso8601(millis: EffectHarness.base + 5_000)))
        #expect(body["revoked_sessions"] == .number(1))
        #expect(body["effect"]?.stringValue?.isEmpty == false)
        #expect(Set(body.objectValue?.keys ?? [:].keys) == ["type", "aud", "sub", "jti", "event_time", "effect", "revoked_sessions"])

        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'completed' AND last_status = 200") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'callbacks' AND outcome = 'retrying' AND http_status = 500") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'callbacks' AND outcome = 'delivered' AND http_status = 200") == 1)
        // The callback's fate never changes the notification's: its effect was applied.
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE status = 'applied'") == 1)
        await e.stop()
        await endpoint.stop()
    }

    @Test("a callback slower than SIWA_CALLBACK_TIMEOUT is a failed attempt, recorded and retried (the same delivery)")
    func slowerThanTimeout() async throws {
        let endpoint = try await CallbackEndpoint.start(hang: true)  // accepts, never answers
        let e = try await Self.harness(endpoint) { $0.lanes.callbacks?.timeout = .seconds(1) }
        try await e.post("consent-revoked", sub: "slow-1", at: 5_000, jti: "slow-jti")
        #expect(try await e.drain() == 1)
        #expect(try await e.deliverCallbacks() == 1)  // cut at its timeout: the endpoint never answered
        #expect(try await e.h.count(
            "SELECT count(*) FROM job_attempts WHERE lane = 'callbacks' AND outcome = 'retrying' AND http_status IS NULL AND error IS NOT NULL") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'retryable' AND attempt = 1") == 1)
        #expect(try await e.deliverCallbacks() == 1)  // the retry, cut the same way
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'callbacks' AND outcome = 'retrying'") == 2)
        #expect(endpoint.arrived.value == 2, "both attempts reached the endpoint")
        #expect(try await e.h.count("SELECT count(DISTINCT job_id)::int FROM job_attempts WHERE lane = 'callbacks'") == 1, "one delivery, attempted twice")
        await e.stop()
        await endpoint.stop()
    }

    @Test("a callback in flight longer than the lease is not delivered twice: the heartbeat renews its lease, so nothing is rescued or claimed by another deliverer")
    func slowerThanLease() async throws {
        let endpoint = try await CallbackEndpoint.start(hang: true)  // holds the POST open
        let e = try await Self.harness(endpoint) { configuration in
            configuration.queue.lease = .seconds(60)
            configuration.lanes.callbacks?.timeout = .seconds(600)
        }
        try await e.post("consent-revoked", sub: "lease-1", at: 5_000)
        #expect(try await e.drain() == 1)
        let deliverer = try #require(e.workers.deliverer(.callbacks))
        let inFlight = Task { try await deliverer.runOnce(http: .shared) }
        #expect(await endpoint.arrived.wait(until: 1, within: .seconds(60)), "the callback never reached the endpoint")
        let t0 = Date()  // the claim was earlier: its lease ends before t0 + 60 s
        // The heartbeat, as its schedule runs it (a third of the lease) at 50 s: the lease now ends at 110 s.
        #expect(try await deliverer.heartbeatOnce(now: t0.addingTimeInterval(50)) == 1)
        #expect(try await e.workers.maintainer.runOnce(queueNow: t0.addingTimeInterval(61)).rescued == 0, "rescued past the first lease although renewed")
        let store = JobQueue(client: e.client, logger: Logger(label: "other"))
        #expect(try await store.claimDeliveries(lane: .callbacks, worker: "other/callbacks", limit: 10, lease: .seconds(60), now: t0.addingTimeInterval(61)).isEmpty)
        #expect(endpoint.arrived.value == 1, "sent once")
        // The renewed lease is what holds it: past it, the rescuer hands it on.
        #expect(try await e.workers.maintainer.runOnce(queueNow: t0.addingTimeInterval(111)).rescued == 1)
        inFlight.cancel()
        _ = await inFlight.result
        await e.stop()
        await endpoint.stop()
    }

    @Test("out of attempts: discarded, listed as failed; redeliver sends it again under the same webhook-id")
    func discardedThenRedelivered() async throws {
        let endpoint = try await CallbackEndpoint.start()
        let e = try await Self.harness(endpoint) { $0.queue.maxAttempts = 2 }
        try await e.post("email-disabled", sub: "cb2", at: 1_000, email: "cb2@privaterelay.appleid.com")
        try await e.drain()
        endpoint.answer([503, 503])
        try await e.deliverCallbacks()
        try await e.deliverCallbacks()
        let store = JobQueue(client: e.client, logger: e.h.logs.logger())
        let failed = try await store.listCallbacks(failed: true, limit: 10)
        #expect(failed.map(\.state) == [.discarded])
        #expect(failed.first?.lastStatus == 503)
        #expect(failed.first?.lastError == "HTTP 503")
        #expect(try await e.deliverCallbacks() == 0)  // discarded: not sent again by itself

        let id = try #require(failed.first?.id)
        #expect(try await store.redeliverCallbacks(id: id, since: nil) == 1)
        #expect(try await e.deliverCallbacks() == 1)
        #expect(try await store.listCallbacks(failed: true, limit: 10).isEmpty)
        let received = endpoint.received
        #expect(received.map(\.status) == [503, 503, 200])
        #expect(Set(received.compactMap { $0.headers["webhook-id"] }) == [failed[0].webhookID])
        // No email address in what is sent.
        #expect(!received.contains { $0.bodyText.contains("privaterelay") })

        #expect(try await store.redeliverCallbacks(id: nil, since: Date().addingTimeInterval(-3600)) == 1)
        #expect(try await store.redeliverCallbacks(id: 987_654, since: nil) == 0)
        await e.stop()
        await endpoint.stop()
    }

    @Test("a dead endpoint (accepts, never answers) does not delay anyone's sign-out")
    func deadEndpointDoesNotDelayEffects() async throws {
        let endpoint = try await CallbackEndpoint.start(hang: true)
        let e = try await Self.harness(endpoint) { configuration in
            configuration.effects.workers = 2
            configuration.lanes.callbacks?.timeout = .seconds(60)  // held open for the whole test
            configuration.lanes.callbacks?.concurrency = 4
        }
        // The deliverer runs as in production; the effects are applied a round at a time.
        let deliverer = try #require(e.workers.deliverer(.callbacks))
        let group = ServiceGroup(configuration: .init(services: [deliverer], logger: e.h.logs.logger()))
        let running = Task { try await group.run() }
        _ = try await e.session(sub: "dead-0", createdAt: 1_000)
        try await e.post("consent-revoked", sub: "dead-0", at: 5_000)
        #expect(try await e.drain() == 1)
        // Its callback reaches the endpoint, which holds it open.
        #expect(try await withDeadline(.seconds(60)) { await endpoint.arrivals.first { _ in true } != nil })
        for index in 1..<40 {
            _ = try await e.session(sub: "dead-\(index)", createdAt: 1_000)
            try await e.post("consent-revoked", sub: "dead-\(index)", at: 5_000)
        }
        #expect(try await e.drain() == 39)
        let applied = try await e.h.count("SELECT count(*) FROM notifications WHERE status = 'applied'")
        // Every effect is in, while the endpoint still holds the first callbacks open.
        let open = endpoint.openRequests
        #expect(applied == 40)
        #expect(try await e.h.count("SELECT count(*) FROM sessions WHERE revoked_at IS NULL") == 0)
        #expect(open > 0)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks'") == 40)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'completed'") == 0)
        running.cancel()  // not a graceful stop: that would wait for the callbacks in hand
        _ = await running.result
        await e.stop()
        await endpoint.stop()
    }

    @Test("configuration: a callback URL needs a valid secret, alert webhooks a different one; each problem names its variable")
    func configuration() throws {
        func error(_ environment: [String: String]) -> String {
            do {
                _ = try Configuration(SettingSource(environment: environment.merging(["SIWA_APPLE_BUNDLE_IDS": "com.example.app"]) { $1 }))
                return "no error"
            } catch {
                return error.description
            }
        }
        #expect(error(["SIWA_CALLBACK_URL": "https://backend.example/siwa"]).hasPrefix("SIWA_CALLBACK_SECRET"))
        #expect(error(["SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": "hunter2"]).contains("secret 1 does not start with whsec_"))
        #expect(error(["SIWA_CALLBACK_URL": "ftp://backend.example/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret]).hasPrefix("SIWA_CALLBACK_URL"))
        #expect(error(["SIWA_CALLBACK_SECRET": TestWebhooks.secret]).hasPrefix("SIWA_CALLBACK_URL"))
        // Alert webhooks never fall back to the callback secret, and may not share it.
        let alerts = ["SIWA_ALERT_WEBHOOK_URLS": "https://alerts.example/hook", "SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret]
        #expect(error(alerts).hasPrefix("SIWA_ALERT_SECRET (--alert-secret): is required when SIWA_ALERT_WEBHOOK_URLS is set"), "\(error(alerts))")
        #expect(error(alerts.merging(["SIWA_ALERT_SECRET": "\(TestWebhooks.rotated) \(TestWebhooks.secret)"]) { $1 }).contains("must differ from every SIWA_CALLBACK_SECRET"))
        #expect(error(["SIWA_ALERT_SECRET": TestWebhooks.secret]).hasPrefix("SIWA_ALERT_WEBHOOK_URLS"))
        #expect(error(alerts.merging(["SIWA_ALERT_SECRET": TestWebhooks.rotated]) { $1 }) == "no error")
        #expect(error(["SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret, "SIWA_CALLBACK_TIMEOUT": "soon"]).hasPrefix("SIWA_CALLBACK_TIMEOUT"))
        let config = try Configuration(SettingSource(
            environment: ["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": "\(TestWebhooks.secret) \(TestWebhooks.rotated)"]))
        #expect(config.workers.lanes.callbacks?.url.absoluteString == "https://backend.example/siwa")
    }
}
