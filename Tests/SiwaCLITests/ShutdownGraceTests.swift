import AsyncHTTPClient
import Foundation
import Logging
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaTestSupport
import Testing

@Suite("SIGTERM past the grace period", .timeLimit(.minutes(10)))
struct ShutdownGraceTests {
    @Test("A delivery still committing when SIWA_SHUTDOWN_GRACE runs out: the process is cut short and exits 1")
    func graceExceeded() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        let serving = try await TestBinary.startServing(environment: [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_DATABASE_TIMEOUT": "120s", "SIWA_SHUTDOWN_GRACE": "1s",
        ])
        let server = serving.process
        let load = DeliveryLoad(bodies: try keys.bodies(count: 1, prefix: "grace"), ports: [serving.port])
        try await TestBinary.withDatabase(databaseURL) { client in
            // Another session holds the lock the receiver's insert needs: the delivery is in flight,
            // and graceful shutdown waits for it.
            try await client.withConnection { connection in
                _ = try await connection.query("BEGIN", logger: Self.logger)
                _ = try await connection.query("LOCK TABLE notifications IN SHARE MODE", logger: Self.logger)
                let delivery = Task { await load.send() }
                let waiting = try await DatabaseEvents.waitForLockWaiters(
                    client, "SELECT count(*) FROM pg_locks WHERE relation = 'notifications'::regclass AND NOT granted", reach: 1)
                try #require(waiting, "the delivery never reached the database (no session waits for the lock on notifications)")
                let signalled = ContinuousClock.now
                server.signal(SIGTERM)
                let status = await server.waitForExit()  // the raw wait status: exit code 1, not a signal
                #expect(status & 0x7f == 0 && (status >> 8) & 0xff == 1, "wait status \(status)")
                // The grace period, then the cancellation bound (5 s): not the database's 120 s deadline.
                #expect(ContinuousClock.now - signalled < .seconds(60))
                _ = try await connection.query("ROLLBACK", logger: Self.logger)
                await delivery.value
            }
        }
    }

    static let logger = Logger(label: "grace")
}
