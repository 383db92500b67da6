import AsyncHTTPClient
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import ServiceLifecycle
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaHTTP
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import Testing

@Suite("Database: outages, restarts, migrations", .timeLimit(.minutes(10)))
struct DatabaseTests {
    static func temporaryDirectory() -> String {
        "/tmp/siwa-\(UUID().uuidString.prefix(8).lowercased())"
    }

    @Test("PostgreSQL stopped → 503 with Retry-After and nothing claimed accepted; recovery without restarting the service")
    func outageAndRecovery() async throws {
        let own = try await OwnCluster.start(label: "outage")
        defer { own.remove() }
        let (cluster, database) = (own.cluster, own.database)
        let h = try await Harness.start(database: database) { $0.database.timeout = .seconds(2) }
        #expect(try await h.server.post(jws: try h.notification(jti: "before")).status == 200)

        try await cluster.stop()
        let during = try await h.server.post(jws: try h.notification(jti: "during"))
        #expect(during.status == 503)
        #expect(during.json?["error"] == .string("unavailable"))
        #expect(during.headers.first(name: "retry-after").flatMap(Int.init) != nil)
        #expect(try await h.server.request(.GET, "/health/ready").status == 503)
        #expect(try await h.server.request(.GET, "/health/live").status == 200)
        // The admin /health stays informative: what it cannot read is null, not an error.
        let health = try await h.server.request(.GET, "/health")
        #expect(health.status == 200 && health.json?["apple_revocations"] == .null, "\(health.status) \(health.body)")

        _ = try await cluster.start()
        // The server's pool reconnects on its own (backing off); a lease waits in its queue until then.
        let reconnected = (try? await withDeadline(.seconds(60)) { try await h.server.client.withConnection { _ in } }) != nil
        #expect(reconnected, "the server's database pool did not reconnect within 60 s of PostgreSQL's restart")
        #expect(try await h.server.request(.GET, "/health/ready").status == 200)
        let retried = try await h.server.post(jws: try h.notification(jti: "during"))
        #expect(retried.status == 200)
        #expect(retried.json?["id"] == .string("during"))
        let stored = try await h.server.application.store.list(NotificationFilter())
        #expect(Set(stored.map(\.jti)) == ["before", "during"])
        await h.stop()
        try await cluster.stop()
    }

    @Test("Stop and restart the service on the embedded database: stored notifications are still listed")
    func embeddedRestart() async throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let signer = try AppleStyleSigner.generate()
        let jwks = URL(fileURLWithPath: directory + "-jwks.json")
        try signer.jwksDocument().write(to: jwks)
        defer { try? FileManager.default.removeItem(at: jwks) }
        var config = try Configuration(bundleIDs: [Harness.aud])
        config.database.dataDirectory = directory
        config.apple.keys.sourceURL = jwks
        config.http.port = 0
        config.http.adminPort = 0
        let logger = Logger(label: "restart")

        for round in 1...2 {
            let database = try await Database.open(config.database, logger: logger, creating: true)
            #expect(database.startedEmbedded)
            let receiver = SiwaApplication(config: config, client: database.client, logger: logger)
            let started = OnceContinuation<Int>()
            let services = try receiver.services(config: config, client: database.client, logger: logger) { started.resume(.success($0.localAddress?.port ?? 0)) }
            let group = ServiceGroup(configuration: .init(services: services, logger: logger))
            let task = Task { try await group.run() }
            let port = try await started.value
            await receiver.keys.waitUntilStarted()  // serving starts while the keys load
            let jws = try signer.notification(aud: Harness.aud, type: "consent-revoked", sub: "001.restart.\(round)", jti: "restart-\(round)")
            var request = HTTPClientRequestBuilder.post("http://127.0.0.1:\(port)/apple/notifications", body: AppleStyleSigner.body(jws))
            #expect(try await request.send() == 200)
            let listed = try await NotificationStore(client: database.client, logger: logger).list(NotificationFilter())
            #expect(listed.map(\.jti) == (round == 1 ? ["restart-1"] : ["restart-2", "restart-1"]))
            await group.triggerGracefulShutdown()
            _ = await task.result
            await database.close()
        }
    }

    @Test("Migrations: applied once under a lock by concurrent starters, recorded with checksums; an edited file is an error")
    func migrations() async throws {
        let config = try await TestCluster.shared.makeDatabase()
        let client = PostgresClient(configuration: config)
        let logger = Logger(label: "migrations")
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            // The test database is a copy of the migrated template: nothing pending.
            #expect(try await Migrator(client: client, logger: logger).migrate() == [])
            try await client.query("DROP SCHEMA public CASCADE")
            try await client.query("CREATE SCHEMA public")
            let applied = try await withThrowingTaskGroup(of: [Int].self) { starters in
                for _ in 0..<4 { starters.addTask { try await Migrator(client: client, logger: logger).migrate() } }
                return try await starters.reduce(into: [Int]()) { $0 += $1 }
            }
            #expect(applied == Migration.all.map(\.version))
            try await Migrator(client: client, logger: logger).checkUpToDate()
            var edited = Migration.all
            edited[0] = Migration(version: edited[0].version, name: edited[0].name, sql: edited[0].sql + "\n-- edited")
            await #expect(throws: MigrationError.self) { try await Migrator(client: client, migrations: edited, logger: logger).migrate() }
            group.cancelAll()
        }
    }

    @Test("With SIWA_MIGRATE_ON_START=false the server refuses to start while the schema is behind, naming `siwa-events migrate`")
    func refusesToStartBehind() async throws {
        let database = try await TestCluster.shared.makeEmptyDatabase()
        do {
            let h = try await Harness.start(database: database) { $0.database.migrateOnStart = false }
            await h.stop()
            Issue.record("the server started on an unmigrated database")
        } catch let error as MigrationError {
            #expect(error.description.contains("siwa-events migrate"))
        }
        // With migrations on start (the default) the same database is brought up to date.
        let h = try await Harness.start(database: database)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        await h.stop()
    }

    @Test("Every file in sql/ is built into the binary, in order")
    func embeddedMigrationsMatchDirectory() throws {
        var root = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { root.deleteLastPathComponent() }
        let files = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("sql").path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(Migration.all.map { String(format: "%03d_%@.sql", $0.version, $0.name) } == files)
        for (migration, file) in zip(Migration.all, files) {
            #expect(migration.sql == (try String(contentsOf: root.appendingPathComponent("sql/\(file)"), encoding: .utf8)))
        }
    }

    @Test("Configuration errors name the variable and the expected form")
    func configurationErrors() {
        func message(_ environment: [String: String]) -> String? {
            do {
                _ = try Configuration(SettingSource(environment: environment))
                return nil
            } catch {
                return error.description
            }
        }
        #expect(message([:])?.contains("SIWA_APPLE_BUNDLE_IDS") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_PORT": "abc"])?.contains("SIWA_PORT (--port): must be an integer between 0 and 65535 (got \"abc\")") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_JWKS_REFRESH_INTERVAL": "1 hour"])?.contains("SIWA_JWKS_REFRESH_INTERVAL") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_EMBEDDED_DATABASE": "off"])?.contains("DATABASE_URL") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_TRUSTED_PROXIES": "10.0.0.0/99"])?.contains("SIWA_TRUSTED_PROXIES") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a", "SIWA_APPLE_JWKS_URL": "ftp://x"])?.contains("SIWA_APPLE_JWKS_URL") == true)
        #expect(message(["SIWA_APPLE_BUNDLE_IDS": "a,b", "SIWA_EMBEDDED_DATABASE": "off", "DATABASE_URL": "postgres://u@h/d"]) == nil)
        #expect(message(["SIWA_ROLE": "worker"]) == nil, "a worker needs no bundle IDs")
    }
}
