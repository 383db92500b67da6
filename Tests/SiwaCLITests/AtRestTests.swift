import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// What `serve` costs the database when nothing arrives: a serverless or autoscaled PostgreSQL
/// scales down only if the service leaves it alone.
@Suite("At rest: the service leaves the database alone", .timeLimit(.minutes(10)))
struct AtRestTests {
    @Test("At rest for a minute serve (role all, the defaults) runs at most 30 transactions; a notification posted then is applied")
    func quietAtRest() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        // A cluster of its own, autovacuum off: pg_stat_database then counts the service alone,
        // whatever the rest of the suite does to the shared cluster meanwhile.
        let cluster = try await OwnCluster.start(label: "rest", settings: ["autovacuum": "off"])
        let databaseURL = cluster.url
        let serving = try await TestBinary.startServing(
            environment: ["DATABASE_URL": databaseURL, "SIWA_EMBEDDED_DATABASE": "off", "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL],
            directory: keys.directory)
        defer { serving.process.signal(SIGKILL) }
        try await TestBinary.withDatabase(databaseURL) { client in
            // Settled: the listener holds LISTEN (its connection's last statement is LISTEN or its check).
            var settled = false
            for _ in 0..<300 where !settled {
                settled = try await TestBinary.count(
                    client,
                    """
                    SELECT count(*)::bigint FROM pg_stat_activity WHERE datname = current_database()
                        AND (query = 'LISTEN "siwa_jobs";' OR query LIKE 'SELECT NULL::text, now() UNION ALL %')
                    """) > 0
                if !settled { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(settled, "serve never held LISTEN: \(serving.output.text.suffix(2000))")
            // Start-up's first round of every periodic loop (each runs once at start) passes.
            try await Task.sleep(for: .seconds(30))
            let transactions: PostgresQuery = "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()"
            let sessions: PostgresQuery = "SELECT sessions::bigint FROM pg_stat_database WHERE datname = current_database()"
            let opened = try await TestBinary.count(client, sessions)
            let before = try await TestBinary.count(client, transactions)
            // The whole minute is the point: what the loops cost at rest.
            try await Task.sleep(for: .seconds(60))
            // Statistics reach pg_stat_database within a second of each transaction.
            try await Task.sleep(for: .seconds(2))
            let after = try await TestBinary.count(client, transactions)
            // Less this test's own readings; the minute plus the 2 s of the wait. Each connection
            // the service opens costs the server one transaction (its start-up) besides.
            let spent = after - before - 2
            let connections = try await TestBinary.count(client, sessions) - opened
            #expect(spent <= 30, "\(spent) transactions at rest in a minute, \(connections) of them connections opened; serve said: \(serving.output.text.suffix(3000))")
            print("at rest: \(spent) transactions and \(connections) connections in 62 s")

            // Then a notification: applied without waiting for any poll.
            let (jti, body) = try #require(try keys.bodies(count: 1, prefix: "rest").first)
            var request = HTTPClientRequest(url: "http://127.0.0.1:\(serving.port)/apple/notifications")
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
            #expect(response.status == .ok)
            var status = ""
            for _ in 0..<200 where status != "applied" {
                for try await (s,) in try await client.query("SELECT status::text FROM notifications WHERE jti = \(jti)").decode((String,).self) { status = s }
                if status != "applied" { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(status == "applied")
        }
        serving.process.signal(SIGTERM)
        #expect(await serving.process.waitForExit() == 0)
        await cluster.stopAndRemove()
    }
}
