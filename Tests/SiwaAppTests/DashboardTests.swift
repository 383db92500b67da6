import Foundation
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The dashboard in a real browser (headless Chromium driven by selenium; scripts/test installs
/// both when missing). Screenshots at 390, 1280 and 1920 px, and of the notification detail, are
/// kept in .build/test-artifacts/.
@Suite("Dashboard in headless Chromium", .timeLimit(.minutes(10)))
struct DashboardTests {

    @Test(
        "serves its shell with a strict CSP, signs in, opens a notification's attempts and a user's sessions in view, keeps data as text, reads at 390-1920 px"
    )
    func dashboard() async throws {
        let endpoint = try await CallbackEndpoint.start()
        let e = try await EffectHarness.start(
            { configuration in
                configuration.lanes.callbacks = .init(url: endpoint.url, signer: try! WebhookSigner(secrets: TestWebhooks.secret))
                configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
            },
            // The API shows where callbacks go without what could be a secret in the URL.
            server: {
                let shown = URL(string: endpoint.url.absoluteString.replacingOccurrences(of: "http://", with: "http://hook:s3cret@") + "?token=abc")!
                $0.workers.lanes.callbacks = .init(url: shown, signer: try! WebhookSigner(secrets: TestWebhooks.secret))
                $0.alerts.endpoint.url = URL(string: "https://siwa.example.com/apple/notifications")
            })
        let shell = try await e.h.server.request(.GET, "/")
        #expect(shell.status == 200)
        let csp = shell.headers.first(name: "content-security-policy") ?? ""
        #expect(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"))
        #expect(!shell.body.contains("<script>"))  // no inline script
        #expect(!shell.body.contains("style="))  // no inline style either (style-src 'self')

        let token = try await API.token(e.h, [.notificationsRead, .alertsRead, .sessionsRead])
        let spike = AlertEpisode(
            key: AlertKey(kind: .revocationSpike, aud: Harness.aud, type: "revocations"), startedAt: Date(), value: 42, peak: 42, baseline: 3.5,
            threshold: 20)
        _ = try await AlertStore(client: e.client, logger: e.h.logs.logger()).fire(spike, window: .seconds(300)) { _ in [] }
        // An app transfer 47 days and a half ago (13 days left, the day under way counted): 3 users, 1 migrated.
        let transfers = TransferStore(client: e.client, logger: e.h.logs.logger())
        let transfer = try await transfers.start(
            .outgoing, clientID: Harness.aud, aud: Harness.aud, teamID: "TEAMB23456", transferredAt: Date().addingTimeInterval(-47.5 * 86_400), actor: "test")
        for index in 0..<3 { try await e.client.query("INSERT INTO accounts (aud, sub) VALUES (\(Harness.aud), \("001.moving.\(index)"))") }
        try await transfers.listUsers(of: transfer)
        try await transfers.record(.success("st1.moved"), sub: "001.moving.0", of: transfer)
        let accountsToken = try await API.token(e.h, [.notificationsRead, .accountsRead])
        // The endpoint's latest check (stored as the checker stores it): tls failing, its finding
        // quoting markup the page must show as text.
        try await EndpointCheckStore(client: e.client, logger: e.h.logs.logger()).save(
            EndpointReport(
                url: "https://siwa.example.com/apple/notifications", checkedAt: Date(),
                findings: [
                    .init(.url, .ok, "https://siwa.example.com/apple/notifications"), .init(.dns, .ok, "siwa.example.com → 203.0.113.7"),
                    .init(.tls, .fail, "handshake with siwa.example.com:443 failed (TLS 1.2+, full chain verification): a certificate for <b>wrong.example</b>"),
                    .init(.route, .fail, "POST https://siwa.example.com/apple/notifications failed: handshake failed"),
                ], certificateExpiresAt: nil))

        // A revocation of a kept Apple token that ran out of attempts: its token still held.
        try await e.client.query(
            """
            INSERT INTO jobs (lane, kind, aud, sub, target, payload, state, finished_at)
            VALUES ('apple_revocations', 'refresh_token', \(Harness.aud), 'dash-deleted', \(Harness.aud), 'v1.00000000.AAAA', 'discarded', now())
            """)

        // A user as Apple names them, with a session, whose consent revocation is applied and
        // called back: the first callback answered 500, the retry 200.
        let sub = "001847.5f2c9e0b7a4d4c1e8b3f6a2d9c0e7b14.1032"
        let jti = "c8d2f0a4-6b1e-4f7a-9c3d-2e5b8a1f7d60"
        _ = try await e.session(sub: sub, createdAt: 500)
        try await e.post("consent-revoked", sub: sub, at: 1_000, jti: jti)
        #expect(try await e.drain() == 1)
        endpoint.answer([500])
        #expect(try await e.deliverCallbacks() == 1)
        #expect(try await e.deliverCallbacks() == 1)
        #expect(endpoint.received.map(\.status) == [500, 200])

        try await e.post("email-disabled", sub: "dash-user-2", at: 1_000, email: "d2@privaterelay.appleid.com")
        try await e.post("email-enabled", sub: "dash-user-2", at: 1_500, email: "d2@privaterelay.appleid.com")
        let xss = "<img src=x onerror=window.__xss=1>"
        try await e.post("consent-revoked", sub: xss, at: 2_000)
        try await e.drain()
        _ = try await e.h.server.post(jws: try e.h.forged(header: ["alg": "none", "kid": "x"]))
        _ = try await e.h.server.post(jws: try e.h.forged { $0["iss"] = .string("https://example.com") })
        await e.h.flushRejections()

        // The detail the page shows: the callback's webhook-id and where it went.
        let detail = try await API.call(e.h, .GET, "/v1/notifications/\(jti)", token: token)
        let callback = try #require(detail.json?["jobs"]?.arrayValue?.first { $0["lane"] == .string("callbacks") })
        let webhookID = try #require(callback["webhook_id"]?.stringValue)
        #expect(webhookID.hasPrefix("msg_") && callback["state"] == .string("completed") && callback["last_status"] == .number(200))
        #expect(detail.json?["callback_url"] == .string(endpoint.url.absoluteString))
        #expect(!detail.body.contains("s3cret") && !detail.body.contains("token=abc"))

        let artifacts = Repository.root.appendingPathComponent(".build/test-artifacts")
        try FileManager.default.createDirectory(at: artifacts, withIntermediateDirectories: true)
        let screenshots = ["dashboard-390.png", "dashboard-1280.png", "dashboard-1920.png", "dashboard-detail.png", "dashboard-user.png", "dashboard-transfers.png"]
        // An earlier run's screenshots would pass the check below by themselves.
        for name in screenshots { try? FileManager.default.removeItem(at: artifacts.appendingPathComponent(name)) }
        #expect(screenshots.allSatisfy { !FileManager.default.fileExists(atPath: artifacts.appendingPathComponent($0).path) })
        let python = try #require(Executables.find("python3"), "python3 is not on PATH: scripts/test installs it (with selenium)")
        let result = try await Subprocess.run(
            python,
            [
                Repository.root.appendingPathComponent("Tests/browser/dashboard.py").path, e.h.server.adminBaseURL, token, sub, jti, xss, webhookID,
                artifacts.path, accountsToken,
            ],
            environment: ProcessInfo.processInfo.environment)
        #expect(result.succeeded, "\(result.standardOutput.suffix(5000))\n\(result.standardError.suffix(3000))")
        for name in screenshots {
            #expect(FileManager.default.fileExists(atPath: artifacts.appendingPathComponent(name).path), "\(name)")
        }
        await e.stop()
        await endpoint.stop()
    }
}
