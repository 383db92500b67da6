import Foundation
import NIOHTTP1
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import Testing

/// The dashboard in a real browser (headless Chromium driven by selenium; scripts/test installs
/// both when missing). The screenshot is kept in .build/test-artifacts/dashboard.png.
@Suite("Dashboard in headless Chromium")
struct DashboardTests {

    @Test("serves its shell with a strict CSP, signs in with a token, finds a user's notifications and timeline, and keeps data as text")
    func dashboard() async throws {
        let e = try await EffectHarness.start()
        let shell = try await e.h.server.request(.GET, "/")
        #expect(shell.status == 200)
        let csp = shell.headers.first(name: "content-security-policy") ?? ""
        #expect(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"))
        #expect(!shell.body.contains("<script>"))  // no inline script

        let token = try await API.token(e.h, [.notificationsRead, .alertsRead])
        let spike = AlertEpisode(
            key: AlertKey(kind: .revocationSpike, aud: Harness.aud, type: "revocations"), startedAt: Date(), value: 42, peak: 42, baseline: 3.5,
            threshold: 20)
        _ = try await AlertStore(client: e.client, logger: e.h.logs.logger()).fire(spike, window: .seconds(300)) { _ in [] }
        try await e.post("consent-revoked", sub: "dash-user-1", at: 1_000, jti: "dash-jti-1")
        try await e.post("email-disabled", sub: "dash-user-2", at: 1_000, email: "d2@privaterelay.appleid.com")
        let xss = "<img src=x onerror=window.__xss=1>"
        try await e.post("consent-revoked", sub: xss, at: 2_000)
        try await e.drain()

        let artifacts = Repository.root.appendingPathComponent(".build/test-artifacts")
        try FileManager.default.createDirectory(at: artifacts, withIntermediateDirectories: true)
        let screenshot = artifacts.appendingPathComponent("dashboard.png").path
        let python = try #require(
            ["/root/.pyenv/shims/python3", "/usr/local/bin/python3", "/usr/bin/python3"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "python3 is missing: scripts/test installs it")
        let result = try await Subprocess.run(
            python, [Repository.root.appendingPathComponent("Tests/browser/dashboard.py").path, e.h.server.adminBaseURL, token, "dash-user-1", "dash-jti-1", xss, screenshot],
            environment: ProcessInfo.processInfo.environment)
        #expect(result.succeeded, "\(result.standardOutput.suffix(5000))\n\(result.standardError.suffix(3000))")
        #expect(FileManager.default.fileExists(atPath: screenshot))
        await e.stop()
    }
}
