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

/// A database as the previous release left it (`Tests/fixtures/upgrade/`, its README says how it
/// was made: every table with rows, a backend role granted as `db grant-backend` does) migrates
/// forward with the real binary and keeps working.
@Suite("Upgrades: a database from the previous release migrates forward and keeps working", .timeLimit(.minutes(10)))
struct UpgradeTests {
    static let fixture = Repository.root.appendingPathComponent("Tests/fixtures/upgrade/db-at-013.sql")
    static let aud = "com.example.upgrade"
    static let role = "siwa_backend_upgrade"
    /// The fixture's admin token (its hash is in `api_tokens`; a fixed value, for this test only).
    static let fixtureToken = "siwa_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

    @Test("from migration 013: every row kept, new notifications applied to old accounts, old tokens and the backend role's grants still valid")
    func fromPreviousRelease() async throws {
        let database = try await TestCluster.shared.makeEmptyDatabase()
        let socket = try #require(database.unixSocketPath)
        try await Harness.execute(on: database, ["DO $$ BEGIN CREATE ROLE \(Self.role) LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$"])
        let restored = try await Subprocess.run(
            "/usr/bin/env",
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", (socket as NSString).deletingLastPathComponent, "-U", database.username,
             "-d", database.database ?? "", "-f", Self.fixture.path],
            environment: ProcessInfo.processInfo.environment)
        try #require(restored.succeeded, "restoring the fixture: \(restored.combinedOutput)")
        let before = try await Self.rowCounts(database)
        let empty = before.filter { $0.value == 0 }.map(\.key).sorted()
        #expect(empty.isEmpty, "the fixture should have rows in every table: \(empty)")

        // The real binary migrates it.
        let url = "postgres://\(database.username)@/\(database.database ?? "")?host=\((socket as NSString).deletingLastPathComponent)"
        let migrated = try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(migrated.status == 0, "\(migrated.stderr)")
        #expect(migrated.stdout.hasPrefix("applied migrations: 14"), "\(migrated.stdout)")
        let after = try await Self.rowCounts(database)
        for (table, count) in before { #expect(after[table] == count, "\(table): \(count) rows before the upgrade, \(after[table] ?? 0) after") }
        // A second migrate applies nothing: it says so, and the migration records are as they were.
        let recorded = try await Self.migrations(database)
        #expect(recorded.count > 13, "\(recorded)")
        let again = try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(again.status == 0, "\(again.stderr)")
        #expect(again.stdout == "schema is up to date\n", "\(again.stdout)")
        #expect(try await Self.migrations(database) == recorded)

        // The service over it: an old user's consent revoked now revokes the session made before.
        let h = try await Harness.start(database: database) { $0.apple.bundleIDs = [Self.aud] }
        let workers = EffectWorkers(configuration: .init(), store: EffectStore(client: h.server.client, logger: h.logs.logger()), logger: h.logs.logger())
        let jws = try h.signer.notification(aud: Self.aud, type: "consent-revoked", sub: "001.up.1", eventTime: Date(), jti: "after-upgrade")
        let answer = try await h.server.post(jws: jws)
        #expect(answer.status == 200, "\(answer.body)")
        var applied = 0
        while try await workers.effects[0].runOnce().claimed > 0 { applied += 1 }
        #expect(applied > 0)
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE aud = 'com.example.upgrade' AND sub = '001.up.1' AND revoked_at IS NULL") == 0)
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE jti IN ('up-1', 'up-2', 'up-3', 'up-4', 'after-upgrade') AND status = 'applied'") == 5)
        // The notifications recorded before the upgrade are listed by the API, with a token made then.
        let listed = try await API.call(h, .GET, "/v1/notifications?aud=com.example.upgrade", token: Self.fixtureToken)
        #expect(listed.status == 200)
        let ids = (listed.json?["items"]?.arrayValue ?? []).compactMap { $0["jti"]?.stringValue }
        #expect(Set(ids).isSuperset(of: ["up-1", "up-2", "up-3", "up-4"]), "\(listed.body)")
        await h.stop()

        // The backend role granted before the upgrade still runs docs/integration.md's session SQL.
        var backend = database
        backend.username = Self.role
        let client = PostgresClient(configuration: backend)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await client.query(
                "INSERT INTO sessions (aud, sub, expires_at, identity_issued_at) VALUES ('com.example.upgrade', '001.up.new', now() + interval '30 days', now())")
            var rows = 0
            for try await (_,) in try await client.query("SELECT sub FROM accounts WHERE aud = 'com.example.upgrade'").decode((String,).self) { rows += 1 }
            #expect(rows >= 4)
            try await client.query("UPDATE sessions SET revoked_at = now(), revoked_reason = 'logout' WHERE sub = '001.up.new'")
            await #expect(throws: (any Error).self) { try await client.query("SELECT count(*) FROM notifications") }
        }
    }

    /// Every applied migration as `schema_migrations` records it: version, checksum, time applied.
    static func migrations(_ database: PostgresClient.Configuration) async throws -> [String] {
        let client = PostgresClient(configuration: database)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            var rows: [String] = []
            for try await (row,) in try await client.query(
                "SELECT concat_ws(' ', version, checksum, applied_at) FROM schema_migrations ORDER BY version"
            ).decode((String,).self) {
                rows.append(row)
            }
            return rows
        }
    }

    /// Rows per table of the public schema.
    static func rowCounts(_ database: PostgresClient.Configuration) async throws -> [String: Int] {
        let client = PostgresClient(configuration: database)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            var tables: [String] = []
            for try await (name,) in try await client.query("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1").decode((String,).self) {
                tables.append(name)
            }
            var counts: [String: Int] = [:]
            for table in tables where table != "schema_migrations" {
                for try await (count,) in try await client.query(PostgresQuery(unsafeSQL: "SELECT count(*) FROM \(table)")).decode((Int,).self) {
                    counts[table] = count
                }
            }
            return counts
        }
    }
}
