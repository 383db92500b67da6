import Foundation
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// `quiet_app` through the real binary: an app with two weeks of steady history goes quiet while
/// its notifications arrive under another bundle ID; `alerts evaluate` fires it once, naming the
/// rejections, and resolves it at the next genuine notification.
@Suite("quiet_app through the binary", .timeLimit(.minutes(10)))
struct QuietAppTests {
    @Test("a steady app that stops fires once, names wrong_audience and `rejections list`, and resolves on the next arrival; --dry-run writes nothing")
    func steadyAppStops() async throws {
        let directory = try TestBinary.makeDirectory("quiet")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let environment = [
            "DATABASE_URL": "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)",
            "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_JWKS_URL": "file://\(directory)/keys/jwks.json",
        ]
        #expect(try await TestBinary.run(["migrate"], environment: environment, directory: directory).status == 0)
        let client = PostgresClient(configuration: database)
        let running = Task { await client.run() }
        defer { running.cancel() }
        // Two weeks of one notification every 30 minutes, the last 8 hours ago.
        try await client.query(
            """
            INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, status, kid, issued_at, raw_jws, header, claims, remote_addr, received_at)
            SELECT 'history-' || i, 'com.example.app', 'user-' || (i % 40), 'consent-revoked', 'consent-revoked', now() - i * interval '30 minutes',
                'applied', 'bulk', now(), 'bulk', '{}'::jsonb, '{}'::jsonb, '127.0.0.1', now() - interval '8 hours' - i * interval '30 minutes'
            FROM generate_series(0, 14 * 48 - 1) AS i
            """)
        func count(_ sql: String) async throws -> Int {
            var value = 0
            for try await (n,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((Int,).self) { value = n }
            return value
        }

        let preview = try await TestBinary.run(["alerts", "evaluate", "--dry-run"], environment: environment, directory: directory)
        #expect(preview.status == 0 && preview.stdout.contains("would be firing quiet_app com.example.app: nothing has arrived for com.example.app for 8 h"), "\(preview.stdout) \(preview.stderr)")
        #expect(try await count("SELECT count(*) FROM alerts") == 0, "--dry-run wrote an alert")

        // Apple's notifications now come for another bundle ID: refused as wrong_audience.
        let receiving = environment.merging(["SIWA_ROLE": "receiver"]) { $1 }
        var serving = try await TestBinary.startServing(environment: receiving, directory: directory)
        let refused = try await TestBinary.run(
            ["send", "consent-revoked", "--sub", "user-1", "--keys", "keys", "--aud", "com.example.moved", "--url", "http://127.0.0.1:\(serving.port)"],
            directory: directory)
        #expect(refused.stdout.contains("wrong_audience"), "\(refused.stdout) \(refused.stderr)")
        // Rejections are written in the background, and all of them by the time serve exits.
        serving.process.signal(SIGTERM)
        #expect(await serving.process.waitForExit() == 0)
        #expect(try await count("SELECT count(*) FROM rejection_counts WHERE reason = 'wrong_audience'") == 1)

        let fired = try await TestBinary.run(["alerts", "evaluate"], environment: environment, directory: directory)
        #expect(fired.status == 0, "\(fired.stdout) \(fired.stderr)")
        #expect(fired.stdout.contains("firing quiet_app com.example.app: nothing has arrived for com.example.app for 8 h"), "\(fired.stdout)")
        #expect(fired.stdout.contains("rejected meanwhile (wrong_audience): `siwa-events rejections list`"), "\(fired.stdout)")
        #expect(try await count("SELECT count(*) FROM alerts WHERE kind = 'quiet_app' AND state = 'firing' AND aud = 'com.example.app'") == 1)
        let again = try await TestBinary.run(["alerts", "evaluate"], environment: environment, directory: directory)
        #expect(again.stdout == "nothing fired, changed or resolved\n", "\(again.stdout) \(again.stderr)")

        // The next genuine notification resolves it.
        serving = try await TestBinary.startServing(environment: receiving, directory: directory)
        defer { serving.process.signal(SIGKILL) }
        let accepted = try await TestBinary.run(
            ["send", "consent-revoked", "--sub", "user-2", "--keys", "keys", "--aud", "com.example.app", "--url", "http://127.0.0.1:\(serving.port)"],
            directory: directory)
        #expect(accepted.stdout.hasPrefix("200 "), "\(accepted.stdout) \(accepted.stderr)")
        let resolved = try await TestBinary.run(["alerts", "evaluate"], environment: environment, directory: directory)
        #expect(resolved.stdout.hasPrefix("resolved quiet_app com.example.app:"), "\(resolved.stdout) \(resolved.stderr)")
        #expect(try await count("SELECT count(*) FROM alerts WHERE kind = 'quiet_app' AND state = 'resolved'") == 1)
        #expect(try await count("SELECT count(*) FROM alerts") == 1, "nothing else fired")
        serving.process.signal(SIGTERM)
        #expect(await serving.process.waitForExit() == 0)
    }
}
