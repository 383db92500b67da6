import Foundation
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Synchronization
import Testing

/// The real `siwa-events` binary, as a user runs it (built next to the test bundle by
/// `swift build --build-tests`).
@Suite("siwa-events command line", .timeLimit(.minutes(10)))
struct CLITests {

    @Test("serve on the embedded database, send, SIGTERM (exit 0, PostgreSQL stopped), then the stored notifications are still listed")
    func serveSendStopList() async throws {
        let directory = try TestBinary.makeDirectory("cli")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let environment = ["SIWA_APPLE_BUNDLE_IDS": "com.example.cli", "SIWA_APPLE_JWKS_URL": "file://\(directory)/keys/jwks.json"]
        let serving = try await TestBinary.startServing(environment: environment, directory: directory)
        let (server, port) = (serving.process, serving.port)
        let sent = try await TestBinary.run(
            ["send", "consent-revoked", "--sub", "001.cli.1", "--keys", "keys", "--aud", "com.example.cli", "--url", "http://127.0.0.1:\(port)", "--jti", "cli-1"],
            directory: directory)
        #expect(sent.status == 0, "\(sent.stdout) \(sent.stderr)")
        #expect(sent.stdout.contains(#""status":"accepted""#) == true)
        let wrong = try await TestBinary.run(
            ["send", "consent-revoked", "--sub", "x", "--keys", "keys", "--aud", "com.example.typo", "--url", "http://127.0.0.1:\(port)"],
            directory: directory)
        #expect(wrong.status == 1)
        #expect(wrong.stdout.contains("wrong_audience"))
        // The worker in the same process (role all) applies the effect and logs it (after its
        // commit); the CLI attaches to the running embedded cluster to see it.
        let applied = await serving.output.wait(forLineWith: ["jti=cli-1", "outcome=applied"], within: .seconds(60))
        #expect(applied, "no 'job … jti=cli-1 outcome=applied' line within 60 s: \(serving.output.text.suffix(3000))")
        let whileServing = try await TestBinary.run(["notifications", "list", "--json"], directory: directory)
        let status = whileServing.stdout.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8)) }.first?["status"]
        #expect(status == .string("applied"), "\(whileServing.stdout)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)  // exited with status 0, not killed
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/.siwa/pgdata/postmaster.pid"))

        let listed = try await TestBinary.run(["notifications", "list", "--json"], directory: directory)
        #expect(listed.status == 0)
        let rows = listed.stdout.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8)) }
        #expect(rows.map { $0["jti"]?.stringValue } == ["cli-1"])
        #expect(rows.first?["type"] == .string("consent-revoked"))
        #expect(rows.first?["status"] == .string("applied"))
        #expect(rows.first?["received_at"]?.stringValue?.hasSuffix("Z") == true)
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/.siwa/pgdata/postmaster.pid"))

        let jobs = try await TestBinary.run(["jobs", "list", "--json"], directory: directory)
        let jobRows = jobs.stdout.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8)) }
        #expect(jobRows.map { $0["state"] } == [.string("completed")])
        let replayEffect = try await TestBinary.run(["replay", "cli-1"], directory: directory)
        #expect(replayEffect.status == 0)
        let queued = try await TestBinary.run(["jobs", "list", "--state", "available", "--json"], directory: directory)
        #expect(queued.stdout.split(separator: "\n").count == 1)
        let unknown = try await TestBinary.run(["replay", "no-such-jti"], directory: directory)
        #expect(unknown.status == 1)
        #expect(unknown.stderr.contains("no-such-jti"))

        let replay = try await TestBinary.run(["rejections", "replay"], environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.cli,com.example.typo"], directory: directory)
        #expect(replay.status == 0)
        #expect(replay.stdout.contains("recorded 1"))
    }

    @Test("The embedded PostgreSQL's processes see none of our variables (no SIWA_* secret, no DATABASE_URL); keys generate writes its private key 0600")
    func embeddedEnvironment() async throws {
        let directory = try TestBinary.makeDirectory("env")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        #expect(try FileManager.default.attributesOfItem(atPath: "\(directory)/keys/private-key.pem")[.posixPermissions] as? Int == 0o600)
        let environment = [
            "SIWA_APPLE_BUNDLE_IDS": "com.example.env", "SIWA_APPLE_JWKS_URL": "file://\(directory)/keys/jwks.json",
            "SIWA_METRICS_TOKEN": "a-metrics-secret-0123456789", "SIWA_ALERT_SLACK_URL": "https://hooks.example.com/secret-path",
        ]
        let server = try await TestBinary.startServing(environment: environment, unsetting: { $0 == "DATABASE_URL" }, directory: directory).process
        let postmasterPID = try String(contentsOfFile: "\(directory)/.siwa/pgdata/postmaster.pid", encoding: .utf8).split(separator: "\n").first.map(String.init)
        let pid = try #require(postmasterPID)
        let variables = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ")).split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
        #expect(!variables.isEmpty)
        #expect(variables.contains { $0.hasPrefix("PATH=") })
        let leaked = variables.filter { $0.hasPrefix("SIWA_") || $0.hasPrefix("DATABASE_URL=") || $0.contains("secret") }
        #expect(leaked.isEmpty, "\(leaked)")
    }

    @Test("verify: a real Apple notification is valid at its time (exit 0) and expired now (exit 1); no exp is exit 1 missing_expiry; an unreadable file is exit 2")
    func verify() async throws {
        let fixtures = try Harness.appleFixture("jwks.json").deletingLastPathComponent().path
        let atTime = try await TestBinary.run(
            ["verify", "@\(fixtures)/consent-revoked.json", "--jwks", "\(fixtures)/jwks.json", "--at", "2022-12-02T21:22:12Z",
             "--aud", "com.fullqueuedeveloper.FQAuthSampleiOSApp"], directory: "/tmp")
        #expect(atTime.status == 0)
        let result = JSONValue.parse(Data(atTime.stdout.utf8))
        #expect(result?["valid"] == .bool(true))
        #expect(result?["event"]?["type"] == .string("consent-revoked"))
        let now = try await TestBinary.run(["verify", "@\(fixtures)/consent-revoked.json", "--jwks", "\(fixtures)/jwks.json"], directory: "/tmp")
        #expect(now.status == 1)
        #expect(JSONValue.parse(Data(now.stdout.utf8))?["reason"] == .string("expired"))
        // A token without exp, signed by a key the JWKS holds: refused with its own reason.
        let directory = "/tmp/siwa-verify-\(UUID().uuidString.prefix(6).lowercased())"
        #expect(try await TestBinary.run(["keys", "generate", "--dir", directory], directory: "/tmp").status == 0)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let signer = try AppleStyleSigner(pem: String(contentsOfFile: "\(directory)/private-key.pem", encoding: .utf8))
        var claims = AppleStyleSigner.claims(aud: "com.example.cli", type: "consent-revoked", sub: "s", eventTime: Date(), issuedAt: Date()).objectValue!
        claims["exp"] = nil
        let noExpiry = try signer.sign(header: .object(["kid": .string(signer.kid), "alg": .string("RS256")]), claims: .object(claims))
        let refused = try await TestBinary.run(["verify", noExpiry, "--jwks", "\(directory)/jwks.json", "--aud", "com.example.cli"], directory: "/tmp")
        #expect(refused.status == 1, "\(refused.stdout)\(refused.stderr)")
        #expect(JSONValue.parse(Data(refused.stdout.utf8))?["reason"] == .string("missing_expiry"), "\(refused.stdout)")
        let missing = try await TestBinary.run(["verify", "@/nonexistent.json", "--jwks", "\(fixtures)/jwks.json"], directory: "/tmp")
        #expect(missing.status == 2)
        #expect(missing.stderr.contains("/nonexistent.json"))
    }

    @Test("A missing SIWA_APPLE_BUNDLE_IDS stops serve with a message naming the variable")
    func missingBundleIDs() async throws {
        let run = try await TestBinary.run(["serve"], environment: ["SIWA_APPLE_BUNDLE_IDS": ""], directory: "/tmp")
        #expect(run.status == 78, "a configuration error, as the README's exit codes say: \(run.stderr)")
        #expect(run.stderr.contains("SIWA_APPLE_BUNDLE_IDS"))
    }

    @Test("callbacks: `secret` prints a usable secret; redeliver names what is wrong with its arguments; a bad secret stops serve")
    func callbackCommands() async throws {
        let secret = try await TestBinary.run(["callbacks", "secret"], directory: "/tmp")
        #expect(secret.status == 0)
        #expect(secret.stdout.hasPrefix("whsec_") && secret.stdout.hasSuffix("\n"))
        #expect((try? WebhookSigner(secrets: secret.stdout)) != nil)

        let neither = try await TestBinary.run(["callbacks", "redeliver"], directory: "/tmp")
        #expect(neither.status == 64)
        #expect(neither.stderr.contains("give a callback id, or --since"))
        let badSince = try await TestBinary.run(["callbacks", "redeliver", "--since", "yesterday-ish"], directory: "/tmp")
        #expect(badSince.status == 64)
        #expect(badSince.stderr.contains("--since must be an ISO-8601 time"))

        let serve = try await TestBinary.run(
            ["serve"], environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.cli", "SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": "s3cret"],
            directory: "/tmp")
        #expect(serve.status == 78)
        #expect(serve.stderr.contains("SIWA_CALLBACK_SECRET"))
        // Alert webhooks with only the callback secret (how earlier versions signed them): exit 78.
        let alertsOnly = try await TestBinary.run(
            ["serve"], environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.cli", "SIWA_ALERT_WEBHOOK_URLS": "https://alerts.example/hook", "SIWA_CALLBACK_URL": "https://backend.example/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret],
            directory: "/tmp")
        #expect(alertsOnly.status == 78 && alertsOnly.stderr.contains("SIWA_ALERT_SECRET"), "\(alertsOnly.stderr)")
        #expect(serve.stderr.contains("whsec_"))
    }

    @Test("db grant-backend --role: grants an existing role, names what PUBLIC keeps and its REVOKE, names CREATE ROLE for a missing one; a setting of another command is an unknown option")
    func grantBackend() async throws {
        let url = try await TestBinary.databaseURL()
        let role = "siwa_cli_grant_\(UUID().uuidString.prefix(6).lowercased())"
        try await TestBinary.withDatabase(url) { client in _ = try await client.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN")) }
        let granted = try await TestBinary.run(["db", "grant-backend", "--role", role], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(granted.status == 0, "\(granted.stderr)")
        #expect(granted.stdout.contains("GRANT SELECT ON accounts TO \(role);"), "\(granted.stdout)")
        // What PUBLIC keeps (PostgreSQL's default TEMPORARY) is named with its revocation, as SQL comments.
        let database = try #require(URLComponents(string: url)?.path.dropFirst())
        #expect(granted.stdout.contains("--   REVOKE TEMPORARY ON DATABASE \(database) FROM PUBLIC;"), "\(granted.stdout)")
        #expect(!granted.stdout.contains("CREATE ON SCHEMA public"), "\(granted.stdout)")
        try await TestBinary.withDatabase(url) { client in
            _ = try await client.query(PostgresQuery(unsafeSQL: "REVOKE TEMPORARY ON DATABASE \(database) FROM PUBLIC"))
            _ = try await client.query("GRANT CREATE ON SCHEMA public TO PUBLIC")  // PostgreSQL 14's default
        }
        let regranted = try await TestBinary.run(["db", "grant-backend", "--role", role], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(!regranted.stdout.contains("REVOKE TEMPORARY"), "\(regranted.stdout)")
        #expect(regranted.stdout.contains("--   REVOKE CREATE ON SCHEMA public FROM PUBLIC;"), "\(regranted.stdout)")
        try await TestBinary.withDatabase(url) { client in _ = try await client.query("REVOKE CREATE ON SCHEMA public FROM PUBLIC") }
        let bare = try await TestBinary.run(["db", "grant-backend", "--role", role], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(bare.stdout.contains("-- PUBLIC holds neither TEMPORARY on this database nor CREATE on schema public"), "\(bare.stdout)")
        let missing = try await TestBinary.run(["db", "grant-backend", "--role", "no_such_role_cli"], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(missing.status == 1 && missing.stderr.contains("CREATE ROLE no_such_role_cli"), "\(missing.stderr)")
        let foreign = try await TestBinary.run(["migrate", "--workers", "8"], environment: ["DATABASE_URL": url], directory: "/tmp")
        #expect(foreign.status == 64 && foreign.stderr.contains("--workers"), "\(foreign.stderr)")
    }

    @Test("tokens: create prints exactly the token; list never shows it; after revoke the API answers it 401 (a live one 200); audit list shows both; errors name the flag")
    func tokenCommands() async throws {
        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let environment = ["DATABASE_URL": "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"]
        let created = try await TestBinary.run(["tokens", "create", "--name", "ci", "--scope", "sessions:read", "--scope", "accounts:read"], environment: environment, directory: "/tmp")
        #expect(created.status == 0, "\(created.stderr)")
        let token = created.stdout.dropLast()
        #expect(created.stdout.hasSuffix("\n") && !token.contains("\n"))
        #expect(APIToken.hash(String(token)) != nil)
        let json = try await TestBinary.run(["tokens", "create", "--name", "ci-json", "--scope", "admin", "--expires", "90d", "--json"], environment: environment, directory: "/tmp")
        let object = JSONValue.parse(Data(json.stdout.utf8))
        #expect(object?["name"] == .string("ci-json"))
        #expect(object?["token"]?.stringValue?.hasPrefix("siwa_") == true)
        #expect(object?["scopes"] == .array([.string("admin")]))
        #expect(object?["expires_at"]?.stringValue != nil)

        let listed = try await TestBinary.run(["tokens", "list"], environment: environment, directory: "/tmp")
        #expect(listed.stdout.contains("ci") && listed.stdout.contains("sessions:read,accounts:read"))
        #expect(!listed.stdout.contains(String(token)))
        let duplicate = try await TestBinary.run(["tokens", "create", "--name", "ci", "--scope", "admin"], environment: environment, directory: "/tmp")
        #expect(duplicate.status == 1 && duplicate.stderr.contains("already named ci"))

        let noScope = try await TestBinary.run(["tokens", "create", "--name", "x"], environment: environment, directory: "/tmp")
        #expect(noScope.status == 64 && noScope.stderr.contains("--scope") && noScope.stderr.contains("sessions:write"))
        let badScope = try await TestBinary.run(["tokens", "create", "--name", "x", "--scope", "everything"], environment: environment, directory: "/tmp")
        #expect(badScope.status == 64 && badScope.stderr.contains("--scope everything is not a scope"))

        // A server on the same database: both tokens work until one is revoked.
        let h = try await Harness.start(database: database)
        let live = try await TestBinary.run(["tokens", "create", "--name", "ci-live", "--scope", "sessions:read"], environment: environment, directory: "/tmp")
        let liveToken = String(live.stdout.dropLast())
        let path = "/v1/accounts/com.example.app/001.cli.none/sessions"
        #expect(try await API.call(h, .GET, path, token: String(token)).status == 200)
        #expect(try await API.call(h, .GET, path, token: liveToken).status == 200)
        #expect(try await TestBinary.run(["tokens", "revoke", "ci"], environment: environment, directory: "/tmp").status == 0)
        #expect(try await TestBinary.run(["tokens", "revoke", "ci"], environment: environment, directory: "/tmp").status == 1)
        let refused = try await API.call(h, .GET, path, token: String(token))
        #expect(refused.status == 401 && refused.json?["error"] == .string("unauthorized"), "\(refused.status) \(refused.body)")
        #expect(try await API.call(h, .GET, path, token: liveToken).status == 200)
        await h.stop()
        let audit = try await TestBinary.run(["audit", "list", "--json"], environment: environment, directory: "/tmp")
        let actions = audit.stdout.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8))?["action"]?.stringValue }
        #expect(actions.filter { $0 == "token.create" }.count == 3)
        #expect(actions.contains("token.revoke"))

        let erase = try await TestBinary.run(["accounts", "erase", "--aud", "com.example.app", "--sub", "001.cli.erase"], environment: environment, directory: "/tmp")
        #expect(erase.status == 0 && erase.stdout.contains("revoked 0 sessions"))
    }

    @Test("notifications show, timeline, export (NDJSON, progress on stderr, file 0600) and stats through the real binary")
    func historyCommands() async throws {
        let database = try await TestCluster.shared.makeDatabase()
        let client = PostgresClient(configuration: database)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await client.run() }
            try await BulkLoad.notifications(count: 12_000, users: 3_000, aud: "com.example.app", client: client)
            group.cancelAll()
        }
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let environment = ["DATABASE_URL": "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"]
        let file = "/tmp/siwa-export-\(UUID().uuidString.prefix(8)).ndjson"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let export = try await TestBinary.run(["notifications", "export", "--output", file], environment: environment, directory: "/tmp")
        #expect(export.status == 0, "\(export.stderr)")
        #expect(export.stderr.contains("exported 10000 notifications…"))
        #expect(export.stderr.contains("exported 12000 notifications in"))
        let lines = try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 12_000)
        // Email addresses: the export is its owner's only, also when it replaces a readable file.
        #expect(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int == 0o600)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file)
        #expect(try await TestBinary.run(["notifications", "export", "--output", file, "--sub", "bulk-user-7"], environment: environment, directory: "/tmp").status == 0)
        #expect(try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int == 0o600)
        #expect(try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n").count == 4)
        #expect(Set(lines.compactMap { JSONValue.parse(Data($0.utf8))?["jti"]?.stringValue }).count == 12_000)

        let shown = try await TestBinary.run(["notifications", "show", "bulk-7", "--json"], environment: environment, directory: "/tmp")
        #expect(JSONValue.parse(Data(shown.stdout.utf8))?["jti"] == .string("bulk-7"))
        #expect(try await TestBinary.run(["notifications", "show", "nope"], environment: environment, directory: "/tmp").status == 1)
        let timeline = try await TestBinary.run(["notifications", "timeline", "--aud", "com.example.app", "--sub", "bulk-user-7", "--json"], environment: environment, directory: "/tmp")
        #expect(timeline.stdout.split(separator: "\n").count == 4)  // users 3,000 × 4 notifications each
        let stats = try await TestBinary.run(["notifications", "stats", "--bucket", "day", "--from", "2h", "--json"], environment: environment, directory: "/tmp")
        let total = stats.stdout.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8))?["count"]?.numberValue }.reduce(0, +)
        #expect(total == 12_000)
        let badBucket = try await TestBinary.run(["notifications", "stats", "--bucket", "week"], environment: environment, directory: "/tmp")
        #expect(badBucket.status == 64 && badBucket.stderr.contains("--bucket"))
    }

    // MARK: Files the CLI writes

    @Test("keys generate and notifications export refuse a symlink or another user's file as their target, and write nothing")
    func refusesOthersFiles() async throws {
        let directory = try TestBinary.makeDirectory("private-file")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let victim = "\(directory)/victim"
        try Data("precious\n".utf8).write(to: URL(fileURLWithPath: victim))
        func victimUntouched() throws -> Bool { try String(contentsOfFile: victim, encoding: .utf8) == "precious\n" }

        // A symlink where the private key goes: refused, the link's destination untouched, no other file.
        try FileManager.default.createDirectory(atPath: "\(directory)/keys", withIntermediateDirectories: false)
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/keys/private-key.pem", withDestinationPath: victim)
        let keys = try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory)
        #expect(keys.status == 1, "\(keys.stderr)")
        #expect(keys.stderr.contains("\(directory)/keys/private-key.pem") && keys.stderr.contains("symbolic link") && keys.stderr.contains("remove it"), "\(keys.stderr)")
        #expect(try victimUntouched())
        #expect(try FileManager.default.contentsOfDirectory(atPath: "\(directory)/keys") == ["private-key.pem"])

        // export --output through a symlink.
        let link = "\(directory)/export.ndjson"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: victim)
        let linked = try await TestBinary.run(["notifications", "export", "--output", link], environment: ["DATABASE_URL": ""], directory: directory)
        #expect(linked.status == 1 && linked.stderr.contains(link) && linked.stderr.contains("symbolic link"), "\(linked.stderr)")
        #expect(try victimUntouched())

        // A file another user owns (tests run as root: nobody's).
        let theirs = "\(directory)/theirs.ndjson"
        try Data("theirs\n".utf8).write(to: URL(fileURLWithPath: theirs))
        #expect(chown(theirs, 65534, 65534) == 0)
        let owned = try await TestBinary.run(["notifications", "export", "--output", theirs], environment: ["DATABASE_URL": ""], directory: directory)
        #expect(owned.status == 1 && owned.stderr.contains(theirs) && owned.stderr.contains("belongs to another user"), "\(owned.stderr)")
        #expect(try String(contentsOfFile: theirs, encoding: .utf8) == "theirs\n")
        #expect(try FileManager.default.attributesOfItem(atPath: theirs)[.ownerAccountID] as? Int == 65534)
        try FileManager.default.createDirectory(atPath: "\(directory)/their-keys", withIntermediateDirectories: false)
        try Data("their key\n".utf8).write(to: URL(fileURLWithPath: "\(directory)/their-keys/private-key.pem"))
        #expect(chown("\(directory)/their-keys/private-key.pem", 65534, 65534) == 0)
        let theirKeys = try await TestBinary.run(["keys", "generate", "--dir", "their-keys"], directory: directory)
        #expect(theirKeys.status == 1 && theirKeys.stderr.contains("belongs to another user"), "\(theirKeys.stderr)")
        #expect(try String(contentsOfFile: "\(directory)/their-keys/private-key.pem", encoding: .utf8) == "their key\n")
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: directory)) == ["victim", "keys", "export.ndjson", "theirs.ndjson", "their-keys"])
    }

    @Test("An export replaces an existing file whole (a new file, mode 0600); one that fails leaves the old file and no temporary file")
    func exportReplacesWhole() async throws {
        let directory = try TestBinary.makeDirectory("export-replace")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = "\(directory)/export.ndjson"
        try Data("old\n".utf8).write(to: URL(fileURLWithPath: target))
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: target)
        let before = try #require(FileManager.default.attributesOfItem(atPath: target)[.systemFileNumber] as? Int)

        // No database here (no DATABASE_URL, no embedded cluster in this directory): it fails after the file is opened.
        let failed = try await TestBinary.run(["notifications", "export", "--output", target], environment: ["DATABASE_URL": ""], directory: directory)
        #expect(failed.status != 0 && failed.stderr.contains("DATABASE_URL"), "\(failed.stderr)")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "old\n")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["export.ndjson"])

        let exported = try await TestBinary.run(["notifications", "export", "--output", target], environment: ["DATABASE_URL": try await TestBinary.databaseURL()], directory: directory)
        #expect(exported.status == 0, "\(exported.stderr)")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "")  // a new database: no notifications
        let attributes = try FileManager.default.attributesOfItem(atPath: target)
        #expect(attributes[.posixPermissions] as? Int == 0o600)
        #expect(attributes[.systemFileNumber] as? Int != before, "replaced by a rename, not rewritten in place")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["export.ndjson"])
    }

    @Test("An export interrupted (SIGINT) while its new file is open leaves the old file and no temporary file")
    func interruptedExport() async throws {
        let directory = try TestBinary.makeDirectory("export-interrupted")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = "\(directory)/export.ndjson"
        try Data("old\n".utf8).write(to: URL(fileURLWithPath: target))
        // A database that accepts the connection and never answers: the export waits with its new file open.
        let silent = TestBinary.SilentListener()
        let export = try Subprocess.start(
            TestBinary.url.path, ["notifications", "export", "--output", target],
            environment: ProcessInfo.processInfo.environment.merging(["DATABASE_URL": "postgres://siwa@127.0.0.1:\(silent.port)/siwa?sslmode=disable"]) { $1 },
            workingDirectory: directory)
        // The export opens its new file, then connects: at its connection the files are counted and
        // it is interrupted, on the waiting thread, well within the export's 5 s connect limit.
        let files = await silent.waitForConnection {
            let count = (try? FileManager.default.contentsOfDirectory(atPath: directory).count) ?? -1
            export.signal(SIGINT)
            return count
        }
        #expect(files != nil, "the export never connected to the database")
        #expect(files == 2, "no new file beside the target")
        let status = await export.waitForExit()
        #expect(status & 0x7f == SIGINT, "ended by SIGINT, as without the cleanup (status \(status))")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "old\n")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["export.ndjson"])
    }
}
