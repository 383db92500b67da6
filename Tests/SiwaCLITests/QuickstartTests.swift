import Foundation
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The README's Quickstart as an adopter follows it, on the embedded database: the blocks marked
/// `<!-- tested: … -->` run as written, with the debug binary in place of the release build and
/// free ports in place of 8080 and 8081.
@Suite("The README's Quickstart")
struct QuickstartTests {
    @Test("Quickstart: a test notification is accepted and listed; a session from keys id-token is revoked by consent-revoked")
    func quickstart() async throws {
        let blocks = try IntegrationGuideTests.testedBlocks(in: "README.md")
        #expect(Set(blocks.keys) == ["quickstart", "quickstart-revoked"], "README.md's tested blocks changed: run each new one here")
        var (port, adminPort) = (0, 0)  // the server's, once it has bound them
        func block(_ name: String) throws -> String {
            try #require(blocks[name]?.code, "README.md has no tested block \(name)")
                .replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(port)")
                .replacingOccurrences(of: "127.0.0.1:8081", with: "127.0.0.1:\(adminPort)")
        }

        let directory = try TestBinary.makeDirectory("quickstart")
        try FileManager.default.createDirectory(atPath: "\(directory)/bin", withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/bin/siwa-events", withDestinationPath: TestBinary.url.path)
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") && $0.key != "DATABASE_URL" }
        let shell = IntegrationGuideTests.Shell(directory: directory, environment: environment.merging([
            "PATH": "\(directory)/bin:" + (environment["PATH"] ?? "/usr/bin:/bin")
        ]) { $1 })

        // Steps 1 and 2, with the debug binary. The callback endpoint only tells the test when an
        // effect is committed (its callback is enqueued in the effect's transaction).
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "siwa-keys"], directory: directory).status == 0)
        let endpoint = try await CallbackEndpoint.start()
        defer { Task { await endpoint.stop() } }
        let serving = try await TestBinary.startServing(
            environment: [
                "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_JWKS_URL": "file://\(directory)/siwa-keys/jwks.json",
                "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
            ], unsetting: { $0.hasPrefix("SIWA_") || $0 == "DATABASE_URL" }, directory: directory)
        let server = serving.process
        defer { server.signal(SIGTERM) }
        (port, adminPort) = (serving.port, serving.adminPort)

        // Steps 3 to 5.
        let steps = try await shell.run(try block("quickstart"))
        #expect(steps.status == 0, "\(steps.stdout) \(steps.stderr)")
        let lines = steps.stdout.split(separator: "\n")
        #expect(lines.first?.hasPrefix(#"200 {"id":"#) == true && lines.first?.contains(#""status":"accepted""#) == true, "\(steps.stdout)")
        #expect(lines.contains { $0.contains("email-disabled") }, "notifications list: \(steps.stdout)")
        #expect(lines.last?.contains(#""status":"accepted""#) == true, "\(steps.stdout)")

        // Both effects committed: email-disabled's callback, then consent-revoked's.
        try #require(await endpoint.arrived.wait(until: 2, within: .seconds(60)))
        let revoked = try await shell.run(try block("quickstart-revoked"))
        #expect(revoked.status == 0 && revoked.stdout == #"{"active":false,"revoked_reason":"consent-revoked"}"# + "\n", "\(revoked.stdout) \(revoked.stderr)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
    }
}
