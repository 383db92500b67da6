import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// What a user sees when the database, a port or Apple's keys are not as expected: the real
/// binary names the setting and the fix, and stops (or waits) as the failure deserves.
@Suite("Start-up errors that name the fix", .timeLimit(.minutes(10)))
struct StartupErrorTests {
    /// `serve`'s environment on ports the kernel picks (0), with the settings given.
    static func serving(_ settings: [String: String]) -> [String: String] {
        ["SIWA_APPLE_BUNDLE_IDS": "com.example.errors", "SIWA_PORT": "0", "SIWA_ADMIN_PORT": "0", "SIWA_DATA_DIR": ""]
            .merging(settings) { $1 }
    }

    @Test("A command run where there is no database says where it looked and which variable to set, exits 78, and creates nothing")
    func noDatabaseHere() async throws {
        let directory = try TestBinary.makeDirectory("nodb")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for command in [
            ["notifications", "list"], ["tokens", "create", "--name", "ci", "--scope", "admin"], ["rejections", "list"], ["alerts", "list"],
            ["jobs", "list"], ["callbacks", "list"], ["audit", "list"], ["replay", "some-jti"],
        ] {
            let run = try await TestBinary.run(command, environment: ["DATABASE_URL": "", "SIWA_DATA_DIR": ""], directory: directory)
            #expect(run.status == 78, "\(command): \(run.status) \(run.stderr)")
            #expect(run.stderr.contains("DATABASE_URL") && run.stderr.contains("\(directory)/.siwa/pgdata") && run.stderr.contains("siwa-events serve"), "\(command): \(run.stderr)")
            #expect(!run.stderr.contains("PSQLError"), "\(command): \(run.stderr)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty, "nothing is created")
    }

    @Test("DATABASE_URL naming an unknown role or database: serve stops at once with exit 78 naming the database, password hidden; a command says the same")
    func databaseRefuses() async throws {
        let directory = try TestBinary.makeDirectory("refused")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let good = try #require(URLComponents(string: try await TestBinary.databaseURL()))
        let socket = try #require(good.queryItems?.first { $0.name == "host" }?.value)
        let database = String(good.path.dropFirst())
        for (url, shown, sqlState) in [
            ("postgres://no_such_role:hunter2@/\(database)?host=\(socket)", "postgres://no_such_role:***@/\(database)", "28000"),
            ("postgres://\(good.user ?? "")@/no_such_database?host=\(socket)", "/no_such_database", "3D000"),
        ] {
            let serve = try await TestBinary.run(["serve"], environment: Self.serving(["DATABASE_URL": url]), directory: directory, within: .seconds(60))
            #expect(serve.status == 78, "\(serve.status): \(serve.output.suffix(3000))")
            #expect(serve.output.contains("DATABASE_URL") && serve.output.contains(shown) && serve.output.contains(sqlState), "\(serve.output.suffix(3000))")
            #expect(!serve.output.contains("hunter2"))
            let list = try await TestBinary.run(["notifications", "list"], environment: ["DATABASE_URL": url], directory: directory)
            #expect(list.status == 78 && list.stderr.contains("DATABASE_URL") && list.stderr.contains(shown), "\(list.status): \(list.stderr)")
            #expect(!list.stderr.contains("hunter2"))
        }
    }

    @Test("DATABASE_URL with a wrong password: serve stops at once with exit 78 naming the database and 28P01, password hidden")
    func wrongPassword() async throws {
        let directory = try TestBinary.makeDirectory("password")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let good = try await TestBinary.databaseURL()
        let components = try #require(URLComponents(string: good))
        let socket = try #require(components.queryItems?.first { $0.name == "host" }?.value)
        let database = String(components.path.dropFirst())
        // A role of its own that must give a password (the test cluster trusts every other one).
        let role = "siwa_password_\(UUID().uuidString.prefix(6).lowercased())"
        let hba = "\(TestCluster.directory)/pgdata/pg_hba.conf"
        let rules = try String(contentsOfFile: hba, encoding: .utf8)
        try ("local all \(role) scram-sha-256\n" + rules).write(toFile: hba, atomically: false, encoding: .utf8)
        try await TestBinary.withDatabase(good) { client in
            try await client.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN PASSWORD 'the-right-one'"))
            _ = try await client.query("SELECT pg_reload_conf()")
        }
        let url = "postgres://\(role):hunter2@/\(database)?host=\(socket)"
        let serve = try await TestBinary.run(["serve"], environment: Self.serving(["DATABASE_URL": url]), directory: directory, within: .seconds(60))
        #expect(serve.status == 78, "\(serve.status): \(serve.output.suffix(3000))")
        #expect(serve.output.contains("DATABASE_URL") && serve.output.contains("postgres://\(role):***@/\(database)") && serve.output.contains("28P01"), "\(serve.output.suffix(3000))")
        #expect(!serve.output.contains("hunter2"))
        let list = try await TestBinary.run(["notifications", "list"], environment: ["DATABASE_URL": url], directory: directory)
        #expect(list.status == 78 && list.stderr.contains("28P01") && !list.stderr.contains("hunter2"), "\(list.status): \(list.stderr)")
    }

    @Test("DATABASE_URL's port refusing connections: serve waits with a warning naming DATABASE_URL and stops cleanly on SIGTERM; a command fails at once")
    func databaseUnreachable() async throws {
        let directory = try TestBinary.makeDirectory("unreachable")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let refusing = TestBinary.RefusingPort()  // DATABASE_URL's port: bound, never listening
        let port = refusing.port
        let url = "postgres://siwa:hunter2@127.0.0.1:\(port)/siwa"
        let (server, serveOutput) = try ChildOutput.start(
            TestBinary.url.path, ["serve"], environment: ProcessInfo.processInfo.environment.merging(Self.serving(["DATABASE_URL": url])) { $1 },
            workingDirectory: directory)
        #expect(await serveOutput.wait(for: "127.0.0.1:\(port)/siwa"), "the warning names the database: \(serveOutput.text)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
        let output = serveOutput.text
        #expect(output.contains("DATABASE_URL") && output.contains("postgres://siwa:***@127.0.0.1:\(port)/siwa") && output.contains("refused"), "\(output)")
        #expect(!output.contains("hunter2") && !output.contains("poolShutdown"), "\(output)")

        let list = try await TestBinary.run(["jobs", "list"], environment: ["DATABASE_URL": url], directory: directory, within: .seconds(30))
        #expect(list.status == 69, "\(list.status): \(list.output)")
        #expect(list.output.contains("DATABASE_URL: cannot reach postgres://siwa:***@127.0.0.1:\(port)/siwa") && list.output.contains("refused"), "\(list.output)")
        withExtendedLifetime(refusing) {}
    }

    @Test("A port in use: serve names the address and SIWA_PORT (or SIWA_ADMIN_PORT) and exits 78")
    func portInUse() async throws {
        let directory = try TestBinary.makeDirectory("port")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let busy = TestBinary.SilentListener()
        let url = try await TestBinary.databaseURL()
        for (setting, name) in [("SIWA_PORT", "SIWA_PORT (--port)"), ("SIWA_ADMIN_PORT", "SIWA_ADMIN_PORT (--admin-port)")] {
            let serve = try await TestBinary.run(
                ["serve"], environment: Self.serving(["DATABASE_URL": url, setting: "\(busy.port)", "SIWA_APPLE_JWKS_URL": "file:///nonexistent/jwks.json"]),
                directory: directory, within: .seconds(60))
            #expect(serve.status == 78, "\(setting): \(serve.status) \(serve.output.suffix(3000))")
            #expect(serve.output.contains("127.0.0.1:\(busy.port) is already in use") && serve.output.contains(name), "\(setting): \(serve.output.suffix(3000))")
            #expect(!serve.output.contains("errno: 98"), "\(serve.output.suffix(3000))")
        }
        withExtendedLifetime(busy) {}
    }

    @Test("Apple's keys not loaded yet: serve listens anyway, readiness says why on the admin listener only (no URL or credentials on the public one), and a notification gets 503 with Retry-After, never 401, and no rejection")
    func keysStillLoading() async throws {
        let directory = try TestBinary.makeDirectory("keys")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let apple = TestBinary.SilentListener()  // accepts the key fetch's connection, never answers
        let url = try await TestBinary.databaseURL()
        // A mirror with credentials in its URL: they are never shown (log, health, errors).
        let jwksURL = "http://mirror:s3cret-pw@127.0.0.1:\(apple.port)/auth/keys"
        // Listening means the database is open (before the listeners) and the keys still loading
        // (the fetch never gets an answer): one answer each, no polling.
        let serving = try await TestBinary.startServing(
            environment: Self.serving(["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": jwksURL]), directory: directory, ready: false)
        let (server, port) = (serving.process, serving.port)
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let publicAnswer = await TestBinary.get(http, "http://127.0.0.1:\(port)/health/ready")
        #expect(publicAnswer?.status == 503, "\(publicAnswer.map { "\($0.status) \($0.body)" } ?? "no answer")")
        let ready = publicAnswer?.body
        let checks = ready.flatMap { JSONValue.parse(Data($0.utf8)) }?["checks"]
        #expect(checks?["database"] == .string("ok"), "\(ready ?? "no answer")")
        // The public listener says one word; the admin listener says why, credentials hidden.
        #expect(checks?["apple_keys"] == .string("loading") && ready?.contains("127.0.0.1") == false, "\(ready ?? "no answer")")
        let adminAnswer = await TestBinary.get(http, "http://127.0.0.1:\(serving.adminPort)/health/ready")
        #expect(adminAnswer?.status == 503, "\(adminAnswer.map { "\($0.status) \($0.body)" } ?? "no answer")")
        let adminReady = adminAnswer?.body
        let adminChecks = adminReady.flatMap { JSONValue.parse(Data($0.utf8)) }?["checks"]
        #expect(adminChecks?["apple_keys"]?.stringValue?.hasPrefix("not loaded") == true, "\(adminReady ?? "no answer")")
        #expect(adminReady?.contains("http://***@127.0.0.1:\(apple.port)/auth/keys") == true && adminReady?.contains("s3cret") == false, "\(adminReady ?? "no answer")")

        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/apple/notifications")
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: try keys.bodies(count: 1, prefix: "early")[0].body))
        let response = try await http.execute(request, timeout: .seconds(60))
        let body = String(buffer: try await response.body.collect(upTo: 1 << 16))
        #expect(response.status.code == 503, "\(response.status) \(body)")
        #expect(Int(response.headers.first(name: "Retry-After") ?? "").map { $0 > 0 } == true, "\(response.headers)")
        #expect(JSONValue.parse(Data(body.utf8))?["error"] == .string("unavailable"), "\(body)")

        let rejections = try await TestBinary.run(["rejections", "list", "--json"], environment: ["DATABASE_URL": url], directory: directory)
        #expect(rejections.status == 0 && rejections.stdout.isEmpty, "\(rejections.stdout) \(rejections.stderr)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
        _ = await serving.output.waitForEnd()
        let output = serving.output.text
        #expect(output.contains("loading apple keys") && output.contains("http://***@127.0.0.1:\(apple.port)/auth/keys"), "\(output.suffix(3000))")
        #expect(!output.contains("s3cret-pw"), "\(output.suffix(3000))")
        try await http.shutdown()
        withExtendedLifetime(apple) {}
    }

    @Test("Every command's --help shows examples")
    func helpHasExamples() async throws {
        var pending = [[String]()]
        var seen: [String] = []
        while let path = pending.popLast() {
            let help = try await TestBinary.run(path + ["--help"], directory: "/tmp")
            #expect(help.status == 0, "\(path): \(help.stderr)")
            let subcommands = help.stdout.components(separatedBy: "SUBCOMMANDS:").dropFirst().first.map { section in
                section.split(separator: "\n", omittingEmptySubsequences: false).dropFirst().prefix { !$0.isEmpty && $0.hasPrefix("  ") }.compactMap { line -> String? in
                    let word = line.split(separator: " ").first.map(String.init)
                    return line.hasPrefix("    ") || word == "help" ? nil : word
                }
            } ?? []
            if subcommands.isEmpty {
                seen.append(path.joined(separator: " "))
                #expect(help.stdout.contains("Examples:") && help.stdout.contains("siwa-events \(path.joined(separator: " "))"), "\(path): \(help.stdout.prefix(600))")
                // Each example on a line of its own: none is wrapped by the 80-column layout.
                let examples = help.stdout.components(separatedBy: "Examples:\n").dropFirst().first?.split(separator: "\n", omittingEmptySubsequences: false).prefix { !$0.isEmpty } ?? []
                #expect(!examples.isEmpty && examples.allSatisfy { $0.hasPrefix("  ") }, "\(path): \(examples)")
            } else {
                pending.append(contentsOf: subcommands.map { path + [$0] })
            }
        }
        #expect(seen.contains("notifications list") && seen.contains("serve") && seen.count > 25, "\(seen)")
    }
}
