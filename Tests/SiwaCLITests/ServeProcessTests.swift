import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import Testing

/// `serve` as an operator runs it: several processes on one database, and the signals that stop it.
@Suite("serve processes: concurrent migration, SIGINT", .timeLimit(.minutes(10)))
struct ServeProcessTests {
    /// `serve` on ports it binds itself, once its key set is loaded.
    static func serve(_ environment: [String: String], directory: String) async throws -> (ChildProcess, ChildOutput, Int) {
        let serving = try await TestBinary.startServing(environment: environment, directory: directory)
        return (serving.process, serving.output, serving.port)
    }

    static func post(_ body: String, port: Int) async throws -> Int {
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/apple/notifications")
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: body))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
        _ = try await response.body.collect(upTo: 1 << 16)
        return Int(response.status.code)
    }

    @Test("three serve processes started at once on one empty database: each migration is applied once, all three serve")
    func concurrentMigration() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let empty = try await TestCluster.shared.makeEmptyDatabase()
        let socket = ((empty.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let url = "postgres://\(empty.username)@/\(empty.database ?? "")?host=\(socket)"
        let environment = ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_MIGRATE_ON_START": "true"]
        let servers = try await withThrowingTaskGroup(of: (ChildProcess, ChildOutput, Int).self) { group in
            for _ in 0..<3 { group.addTask { try await Self.serve(environment, directory: keys.directory) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(servers.count == 3)
        let bodies = try keys.bodies(count: 3, prefix: "concurrent")
        for (index, server) in servers.enumerated() {
            #expect(try await Self.post(bodies[index].body, port: server.2) == 200, "server \(index)")
        }
        try await TestBinary.withDatabase(url) { client in
            var versions: [Int] = []
            for try await (version,) in try await client.query("SELECT version FROM schema_migrations ORDER BY version").decode((Int,).self) {
                versions.append(version)
            }
            #expect(versions == Migration.all.map(\.version), "each migration once: \(versions)")
            for try await (count,) in try await client.query("SELECT count(*)::int FROM notifications").decode((Int,).self) { #expect(count == 3) }
        }
        let applied = servers.map { $0.1.text.components(separatedBy: "migration applied").count - 1 }
        #expect(applied.reduce(0, +) == Migration.all.count, "applied per process: \(applied)")
        for (process, _, _) in servers {
            process.signal(SIGTERM)
            #expect(await process.waitForExit() == 0)
        }
    }

    @Test("SIGINT stops serve gracefully, as SIGTERM does: exit 0 (a shutdown cut short exits 1), and what was acknowledged is stored")
    func sigintDrains() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let url = try await TestBinary.databaseURL()
        for signal in [SIGINT, SIGTERM] {
            let (process, output, port) = try await Self.serve(
                ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL], directory: keys.directory)
            let body = try keys.bodies(count: 1, prefix: "signal-\(signal)")[0]
            #expect(try await Self.post(body.body, port: port) == 200)
            process.signal(signal)
            #expect(await process.waitForExit() == 0, "signal \(signal): \(output.text.suffix(2000))")
            try await TestBinary.withDatabase(url) { client in
                for try await (count,) in try await client.query("SELECT count(*)::int FROM notifications WHERE jti = \(body.jti)").decode((Int,).self) {
                    #expect(count == 1)
                }
            }
        }
    }

    @Test("jobs retry puts a discarded job back (and names an unknown id); alerts silence and silences record and list a silence, and name a bad --kind or --for")
    func operatorCommands() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let url = try await TestBinary.databaseURL()
        // The database refuses this user's account row: the effect fails for real, once, and is discarded.
        try await TestBinary.withDatabase(url) { client in
            try await client.query(
                """
                CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF NEW.sub LIKE '%poison%' THEN RAISE EXCEPTION 'poisoned account'; END IF; RETURN NEW; END $$
                """)
            try await client.query("CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refuse_poison()")
        }
        let (server, output, port) = try await Self.serve(
            ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_JOB_MAX_ATTEMPTS": "1"],
            directory: keys.directory)
        let token = try keys.signer.notification(aud: keys.aud, type: "consent-revoked", sub: "001.poison.1", jti: "poisoned-1")
        #expect(try await Self.post(AppleStyleSigner.body(token), port: port) == 200)
        #expect(await output.wait(for: "outcome=discarded"), "\(output.text.suffix(2000))")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)

        let environment = ["DATABASE_URL": url]
        let discarded = try await TestBinary.run(["jobs", "list", "--state", "discarded", "--json"], environment: environment, directory: keys.directory)
        let job = try #require(JSONValue.parse(Data(discarded.stdout.utf8)), "\(discarded.stdout) \(discarded.stderr)")
        #expect(job["jti"] == .string("poisoned-1") && job["last_error"]?.stringValue?.contains("poisoned account") == true, "\(job)")
        let id = try #require(job["id"]?.numberValue.map { Int($0) })
        let retried = try await TestBinary.run(["jobs", "retry", "\(id)"], environment: environment, directory: keys.directory)
        #expect(retried.status == 0 && retried.stdout.contains("queued 1 job again"), "\(retried.stdout) \(retried.stderr)")
        let none = try await TestBinary.run(["jobs", "list", "--state", "discarded"], environment: environment, directory: keys.directory)
        #expect(none.stdout.contains("no jobs match"), "\(none.stdout)")
        let available = try await TestBinary.run(["jobs", "list", "--state", "available", "--json"], environment: environment, directory: keys.directory)
        #expect(JSONValue.parse(Data(available.stdout.utf8))?["id"] == .number(Double(id)), "\(available.stdout)")
        let unknown = try await TestBinary.run(["jobs", "retry", "987654"], environment: environment, directory: keys.directory)
        #expect(unknown.status == 1 && unknown.stderr.contains("no job 987654"), "\(unknown.stderr)")

        let silenced = try await TestBinary.run(
            ["alerts", "silence", "--kind", "queue_lag", "--for", "2h", "--reason", "planned upgrade"], environment: environment, directory: keys.directory)
        #expect(silenced.status == 0 && silenced.stdout.hasPrefix("silenced queue_lag until "), "\(silenced.stdout) \(silenced.stderr)")
        let listed = try await TestBinary.run(["alerts", "silences", "--json"], environment: environment, directory: keys.directory)
        let silence = try #require(JSONValue.parse(Data(listed.stdout.utf8)), "\(listed.stdout)")
        #expect(silence["kind"] == .string("queue_lag") && silence["reason"] == .string("planned upgrade"), "\(silence)")
        let table = try await TestBinary.run(["alerts", "silences"], environment: environment, directory: keys.directory)
        #expect(table.stdout.contains("queue_lag") && table.stdout.contains("(all)") && table.stdout.contains("planned upgrade"), "\(table.stdout)")
        let badKind = try await TestBinary.run(["alerts", "silence", "--kind", "nope", "--for", "2h"], environment: environment, directory: keys.directory)
        #expect(badKind.status == 64 && badKind.stderr.contains("--kind must be one of"), "\(badKind.stderr)")
        let badFor = try await TestBinary.run(["alerts", "silence", "--kind", "queue_lag", "--for", "0s"], environment: environment, directory: keys.directory)
        #expect(badFor.status == 64 && badFor.stderr.contains("--for must be a duration"), "\(badFor.stderr)")
    }
}
