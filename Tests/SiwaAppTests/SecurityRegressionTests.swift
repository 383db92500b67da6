import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaApple
import SiwaAppleStandIn
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The security reviews' fixes each keep a test. Most live beside their behaviour (AdminHostTests,
/// VerifierTests, KeyCacheTests, SecurityDefinerTests, ConnectionLimitTests, CLITests,
/// StartupErrorTests, SignInCompletionTests, BackendAPITests); these cover what those left open,
/// each through real PostgreSQL, real HTTP or the real binary.
@Suite("Security regressions: what the reviews fixed stays fixed", .timeLimit(.minutes(10)))
struct SecurityRegressionTests {
    static let logger = Logger(label: "security-regression", factory: { _ in SwiftLogNoOpLogHandler() })

    // MARK: 1. Secrets read from files

    @Test("Every secret setting is read from the file its _FILE variable names (trailing newline trimmed), the known secrets among them")
    func everySecretFromItsFile() throws {
        let secrets = Settings.all.filter(\.secret)
        let known: Set = ["DATABASE_URL", "SIWA_CALLBACK_SECRET", "SIWA_ALERT_SECRET", "SIWA_ALERT_SLACK_URL", "SIWA_METRICS_TOKEN", "SIWA_APPLE_TOKEN_KEYS"]
        #expect(Set(secrets.map(\.variable)).isSuperset(of: known), "a secret lost its _FILE variable: \(secrets.map(\.variable))")
        let directory = try TestBinary.makeDirectory("secret-file-each")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for setting in secrets {
            let fileVariable = try #require(setting.fileVariable)
            #expect(fileVariable == setting.variable + "_FILE")
            let value = "\(setting.variable.lowercased())-\(UUID().uuidString)"
            let path = "\(directory)/\(setting.variable)"
            try Data((value + "\n").utf8).write(to: URL(fileURLWithPath: path))
            #expect(try SettingSource(environment: [fileVariable: path]).text(setting) == value, "\(fileVariable)")
        }
    }

    // MARK: 2. Admin Host allowlist

    @Test("With SIWA_ADMIN_HOSTS unset the admin listener answers localhost and IP addresses only: any other name gets 421")
    func adminHostsDefault() async throws {
        #expect(try Configuration(SettingSource(environment: ["SIWA_APPLE_BUNDLE_IDS": Harness.aud])).http.adminHosts == ["localhost"])
        let h = try await Harness.start()
        #expect(h.config.http.adminHosts == ["localhost"])
        let port = try #require(Int(h.server.adminBaseURL.split(separator: ":").last ?? ""))
        let probe = AdminHostTests()
        for host in ["evil.example:\(port)", "siwa-events-admin", "localhost.evil.example"] {
            let answer = try await probe.status(port: port, path: "/metrics", host: host)
            #expect(answer.code == 421, "\(host): \(answer.text.prefix(200))")
        }
        for host in ["localhost:\(port)", "127.0.0.1:\(port)", "[::1]:\(port)"] {
            #expect(try await probe.status(port: port, path: "/metrics", host: host).code == 200, "\(host)")
        }
        await h.stop()
    }

    // MARK: 3. JWS crit header refused (identity tokens too)

    @Test("An identity token with a crit header is refused by POST /v1/sessions as unsupported_header; the same token without it opens a session")
    func identityTokenCritRefused() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.sessionsWrite])
        let genuine = try h.signer.identityToken(aud: Harness.aud, sub: "001.crit.1")
        let payload = try #require(Base64URL.decode(genuine.split(separator: ".")[1]))
        let critical = try h.signer.sign(
            header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256"), "crit": .array([.string("b64")]), "b64": .bool(false)]), payload: payload)
        let refused = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(critical)])
        #expect(refused.status == 401 && refused.json?["error"] == .string("invalid_token"), "\(refused.body)")
        #expect(refused.json?["reason"] == .string("unsupported_header"), "\(refused.body)")
        #expect(try await h.count("SELECT count(*) FROM sessions") == 0)
        #expect(try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(genuine)]).status == 201)
        await h.stop()
    }

    // MARK: 4. Bounded kids and key sets

    @Test("A forged kid of 45 KB is stored in the rejection bounded (the kid column and the message), not whole")
    func forgedKidStoredBounded() async throws {
        let h = try await Harness.start()
        let huge = String(repeating: "k", count: 45_000)
        let answer = try await h.server.post(jws: try h.forged(header: ["kid": .string(huge), "alg": .string("RS256")]))
        #expect(answer.status == 401 && answer.json?["reason"] == .string("unknown_key"), "\(answer.status)")
        #expect(answer.body.utf8.count < 2_048, "the answer carries the kid whole")
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'unknown_key'") == 1)
        #expect(try await h.count("SELECT max(octet_length(kid))::int FROM rejections") < 1_024)
        #expect(try await h.count("SELECT max(octet_length(message))::int FROM rejections") <= 2_048)
        await h.stop()
    }

    @Test("A key-set document over 1 MiB is not taken: the fetch fails, the last good set keeps verifying, its new key stays unknown; just under 1 MiB is taken")
    func keySetSizeBounded() async throws {
        let signer = try AppleStyleSigner.generate()
        let under = try AppleStyleSigner.generate()
        let over = try AppleStyleSigner.generate()
        /// The signers' keys, padded (an unknown member, which a decoder ignores) to `size` bytes.
        func document(_ signers: [AppleStyleSigner], size: Int) throws -> Data {
            let keys = try signers.map { try #require(JSONValue.parse($0.jwksDocument())?["keys"]?.arrayValue?.first) }
            let bare = JSONValue.object(["keys": .array(keys), "padding": .string("")]).jsonText.utf8.count
            let text = JSONValue.object(["keys": .array(keys), "padding": .string(String(repeating: "x", count: max(0, size - bare)))]).jsonText
            #expect(text.utf8.count == size)
            return Data(text.utf8)
        }
        let apple = try await JWKSServer.start(document: try document([signer], size: 4_096))
        let h = try await Harness.start(signer: signer, jwksURL: apple.url)
        apple.serve(try document([signer, under], size: (1 << 20) - 1))
        #expect(await h.server.application.keys.runOnce() == .fetched)
        let byUnder = try under.notification(aud: Harness.aud, type: "consent-revoked", sub: "001.keys.1")
        #expect(try await h.server.post(jws: byUnder).status == 200)

        apple.serve(try document([signer, under, over], size: (1 << 20) + 1))
        #expect(await h.server.application.keys.runOnce() == .failed)
        #expect(h.logs.all.contains { $0.contains("1 MiB") }, "the log says why")
        let byOver = try over.notification(aud: Harness.aud, type: "consent-revoked", sub: "001.keys.2")
        #expect(try await h.server.post(jws: byOver).status != 200)
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE sub = '001.keys.2'") == 0)
        #expect(try await h.server.post(jws: try h.notification(sub: "001.keys.3")).status == 200)
        #expect(try await h.server.post(jws: try under.notification(aud: Harness.aud, type: "consent-revoked", sub: "001.keys.4")).status == 200)
        await h.stop()
        await apple.stop()
    }

    // MARK: 8. No-follow files: every writer of a private file

    @Test("transfers export and standin serve's team key refuse a symlink as their file (dangling or not) and write nothing through it")
    func privateFileWritersRefuseSymlinks() async throws {
        let directory = try TestBinary.makeDirectory("no-follow")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let victim = "\(directory)/victim"
        try Data("precious\n".utf8).write(to: URL(fileURLWithPath: victim))
        let elsewhere = "\(directory)/created-through-a-link"

        let environment = ["DATABASE_URL": try await TestBinary.databaseURL(), "SIWA_APPLE_BUNDLE_IDS": "com.example.app"]
        let today = ISO8601DateFormatter().string(from: Date()).prefix(10)
        let started = try await TestBinary.run(["transfers", "start", "--target", "TEAMB23456", "--date", String(today)], environment: environment, directory: directory)
        #expect(started.status == 0, "\(started.stdout) \(started.stderr)")
        for (name, target) in [("export.ndjson", victim), ("dangling.ndjson", elsewhere)] {
            let link = "\(directory)/\(name)"
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
            let export = try await TestBinary.run(
                ["transfers", "export", "--target", "TEAMB23456", "--output", link], environment: environment, directory: directory)
            #expect(export.status == 1 && export.stderr.contains(link) && export.stderr.contains("symbolic link"), "\(export.status) \(export.stderr)")
        }
        // Control: the same export to a plain path is written (0600).
        let plain = try await TestBinary.run(
            ["transfers", "export", "--target", "TEAMB23456", "--output", "\(directory)/plain.ndjson"], environment: environment, directory: directory)
        #expect(plain.status == 0, "\(plain.stderr)")
        #expect(try FileManager.default.attributesOfItem(atPath: "\(directory)/plain.ndjson")[.posixPermissions] as? Int == 0o600)

        let keys = try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory)
        #expect(keys.status == 0, "\(keys.stderr)")
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/keys/AuthKey_KEYID12345.p8", withDestinationPath: elsewhere)
        let standIn = try await TestBinary.run(
            ["standin", "serve", "--keys", "keys", "--port", "0", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "com.example.app"],
            environment: [:], directory: directory, within: .seconds(60))
        #expect(standIn.status == 1 && standIn.output.contains("AuthKey_KEYID12345.p8") && standIn.output.contains("symbolic link"), "\(standIn.status) \(standIn.output)")

        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "precious\n")
        #expect(!FileManager.default.fileExists(atPath: elsewhere), "written through a dangling link")
        let left = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".tmp") }
        #expect(left.isEmpty, "\(left)")
    }

    // MARK: 9. Redacted URLs

    @Test("serve with credentials in DATABASE_URL and the key-set, callback, alert webhook and public URLs: its log and health answers show ***@, never a password, nor the Slack URL's secret")
    func serveRedactsConfiguredURLs() async throws {
        let directory = try TestBinary.makeDirectory("redacted-urls")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let apple = try await JWKSServer.start(document: try keys.signer.jwksDocument())
        let applePort = try #require(apple.url.port)
        let mark = UUID().uuidString.prefix(8).lowercased()
        let passwords = ["db-pw-\(mark)", "jwks-pw-\(mark)", "cb-pw-\(mark)", "al-pw-\(mark)", "slack-pw-\(mark)", "probe-pw-\(mark)"]
        let plain = try #require(URLComponents(string: try await TestBinary.databaseURL()))
        let socket = try #require(plain.queryItems?.first { $0.name == "host" }?.value)
        let user = try #require(plain.user)
        let database = "postgres://\(user):\(passwords[0])@/\(plain.path.dropFirst())?host=\(socket)"
        let jwks = apple.url.absoluteString.replacingOccurrences(of: "http://", with: "http://mirror:\(passwords[1])@")
        let environment = [
            "DATABASE_URL": database, "SIWA_EMBEDDED_DATABASE": "off", "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": jwks,
            "SIWA_CALLBACK_URL": "http://hook:\(passwords[2])@127.0.0.1:9/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
            "SIWA_ALERT_WEBHOOK_URLS": "http://alerts:\(passwords[3])@127.0.0.1:9/alerts", "SIWA_ALERT_SECRET": TestWebhooks.rotated,
            "SIWA_ALERT_SLACK_URL": "https://hooks.slack.invalid/services/T0000/B0000/\(passwords[4])",
            "SIWA_PUBLIC_URL": "https://probe:\(passwords[5])@127.0.0.1:9/apple/notifications", "SIWA_LOG_LEVEL": "debug",
        ]
        let serving = try await TestBinary.startServing(
            environment: environment, unsetting: { $0.hasPrefix("SIWA_") || $0.hasPrefix("DATABASE_URL") }, directory: directory)
        var answers: [String] = []
        for url in ["http://127.0.0.1:\(serving.port)/health/ready", "http://127.0.0.1:\(serving.adminPort)/health/ready", "http://127.0.0.1:\(serving.adminPort)/health"] {
            let answer = await TestBinary.get(HTTPClient.shared, url)
            #expect(answer != nil, "\(url)")
            answers.append(answer?.body ?? "")
        }
        #expect(answers[2].contains("https://***@127.0.0.1:9/apple/notifications"), "the endpoint check's URL, redacted: \(answers[2])")
        serving.process.signal(SIGTERM)
        #expect(await serving.process.waitForExit() == 0)
        _ = await serving.output.waitForEnd()
        let output = serving.output.text
        // The lines that name each URL are there, redacted.
        #expect(output.contains("postgres://\(user):***@/"), "\(output.suffix(3000))")
        #expect(output.contains("http://***@127.0.0.1:\(applePort)"), "\(output.suffix(3000))")
        for password in passwords {
            #expect(!output.contains(password), "\(password) in the log: \(output.suffix(3000))")
            for answer in answers.dropLast() { #expect(!answer.contains(password), "\(password) in an answer: \(answer)") }
            if password != passwords[5] { #expect(!answers[2].contains(password), "\(password) in /health: \(answers[2])") }
        }
        #expect(!answers[2].contains(passwords[5]), "\(answers[2])")
        let stored = try await TestBinary.withDatabase(try #require(plain.string)) { client in
            var found: [String] = []
            for password in passwords where try await DatabaseSearch.occurrences(of: password, in: client) > 0 { found.append(password) }
            return found
        }
        #expect(stored.isEmpty, "stored in the database: \(stored)")
        await apple.stop()
    }

    /// Settings whose malformed value is still quoted whole in the error (found by this test; to be fixed in
    /// Sources/SiwaApp/Settings/Setting.swift's parseWebURL): remove each from here once it is redacted.
    @Test("A malformed secret or URL setting stops serve (exit 78) naming the variable, never showing the secret or a URL's password")
    func badSettingsNameNoSecret() async throws {
        let directory = try TestBinary.makeDirectory("bad-secret")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let p8 = "\(directory)/AuthKey_KEYID12345.p8"
        try TestClientSecrets(teamID: "TEAMID1234", keyID: "KEYID12345").key.pemRepresentation.write(toFile: p8, atomically: true, encoding: .utf8)
        let credentials = [
            "SIWA_APPLE_TEAM_ID": "TEAMID1234", "SIWA_APPLE_KEY_ID": "KEYID12345", "SIWA_APPLE_PRIVATE_KEY_FILE": p8,
            "SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey(),
        ]
        let mark = "Leak\(UUID().uuidString.prefix(8))"
        let cases: [(variable: String, environment: [String: String])] = [
            ("DATABASE_URL", ["DATABASE_URL": "mysql://siwa:\(mark)@db.example/siwa"]),
            ("SIWA_APPLE_JWKS_URL", ["SIWA_APPLE_JWKS_URL": "ftp://mirror:\(mark)@keys.example/auth/keys"]),
            ("SIWA_APPLE_AUTH_URL", credentials.merging(["SIWA_APPLE_AUTH_URL": "ftp://apple:\(mark)@auth.example"]) { $1 }),
            ("SIWA_APPLE_TOKEN_KEYS", credentials.merging(["SIWA_APPLE_TOKEN_KEYS": "not-base64-\(mark)"]) { $1 }),
            ("SIWA_CALLBACK_SECRET", ["SIWA_CALLBACK_URL": "http://127.0.0.1:9/siwa", "SIWA_CALLBACK_SECRET": "whsec-\(mark)"]),
            ("SIWA_ALERT_SECRET", ["SIWA_ALERT_WEBHOOK_URLS": "http://127.0.0.1:9/alerts", "SIWA_ALERT_SECRET": "whsec-\(mark)"]),
            ("SIWA_METRICS_TOKEN", ["SIWA_METRICS_TOKEN": "s\(mark)"]),
            ("SIWA_CALLBACK_URL", ["SIWA_CALLBACK_URL": "ftp://hook:\(mark)@backend.example/siwa", "SIWA_CALLBACK_SECRET": TestWebhooks.secret]),
            ("SIWA_ALERT_WEBHOOK_URLS", ["SIWA_ALERT_WEBHOOK_URLS": "ftp://alerts:\(mark)@backend.example/a", "SIWA_ALERT_SECRET": TestWebhooks.rotated]),
            ("SIWA_ALERT_SLACK_URL", ["SIWA_ALERT_SLACK_URL": "hooks.slack.example/services/T0000/B0000/\(mark)"]),
            ("SIWA_PUBLIC_URL", ["SIWA_PUBLIC_URL": "ftp://probe:\(mark)@siwa.example.com/apple/notifications"]),
        ]
        for (variable, environment) in cases {
            let run = try await TestBinary.run(
                ["serve"],
                environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_EMBEDDED_DATABASE": "off", "DATABASE_URL": "postgres://siwa@127.0.0.1:1/siwa"]
                    .merging(environment) { $1 },
                directory: directory, within: .seconds(60))
            #expect(run.status == 78 && run.output.contains(variable), "\(variable): \(run.status) \(run.output.suffix(2000))")
            #expect(!run.output.contains(mark), "\(variable): the secret in the error: \(run.output.suffix(2000))")
        }
    }

    // MARK: 10. The backend role reads none of the service's own tables

    static let serviceOnly = [
        "apple_tokens", "jobs", "apple_auth_calls", "transfers", "transfer_subs", "transfer_imports", "account_sub_changes", "audit_log",
    ]

    static func withClient<T: Sendable>(_ configuration: PostgresClient.Configuration, _ body: (PostgresClient) async throws -> T) async throws -> T {
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    /// The SQLSTATE `sql` fails with; nil when it succeeds.
    static func sqlState(_ client: PostgresClient, _ sql: String) async -> String? {
        do {
            try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger)
            return nil
        } catch let error as PSQLError {
            return error.serverInfo?[.sqlState] ?? "\(error)"
        } catch {
            return "\(error)"
        }
    }

    /// Makes a role, grants it what `db grant-backend` grants on `database` (at whatever version
    /// it is), then `afterGrant` (e.g. an upgrade); returns the role and every table and view in public.
    static func backendRole(
        on database: PostgresClient.Configuration, afterGrant: (PostgresClient) async throws -> Void = { _ in }
    ) async throws -> (role: String, tables: [String]) {
        let role = "backend_\(UUID().uuidString.prefix(8).lowercased())"
        return try await withClient(database) { owner in
            try await owner.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN"), logger: logger)
            _ = try await BackendGrants(client: owner, logger: logger).grant(role: role)
            try await afterGrant(owner)
            var tables: [String] = []
            for try await (name,) in try await owner.query(
                "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1", logger: logger
            ).decode((String,).self) {
                tables.append(name)
            }
            return (role, tables)
        }
    }

    @Test(
        "db grant-backend's role is refused (42501 permission denied) every table but sessions and accounts — apple_tokens, jobs, apple_auth_calls, the transfer tables, account_sub_changes, audit_log — also when granted before the migrations that made them"
    )
    func backendRoleRefusedServiceTables() async throws {
        let current = try await TestCluster.shared.makeDatabase()
        let older = try await TestCluster.shared.makeEmptyDatabase()
        _ = try await Self.withClient(older) { owner in
            try await Migrator(client: owner, migrations: Migration.all.filter { $0.version < 16 }, logger: Self.logger).migrate()
        }
        let granted = [
            ("granted at the current schema", try await Self.backendRole(on: current), current),
            (
                "granted at sql/015, then upgraded",
                try await Self.backendRole(on: older) { owner in _ = try await Migrator(client: owner, logger: Self.logger).migrate() }, older
            ),
        ]
        for (label, (role, tables), database) in granted {
            #expect(Set(tables).isSuperset(of: Self.serviceOnly + ["sessions", "accounts"]), "\(label): \(tables)")
            var asRole = database
            asRole.username = role
            try await Self.withClient(asRole) { backend in
                for table in ["sessions", "accounts"] {
                    #expect(await Self.sqlState(backend, "SELECT count(*) FROM public.\(table)") == nil, "\(label): \(table) is the role's to read")
                }
                for table in tables where !["sessions", "accounts"].contains(table) {
                    #expect(await Self.sqlState(backend, "SELECT count(*) FROM public.\(table)") == "42501", "\(label): \(table) is readable by the backend role")
                }
                for table in Self.serviceOnly {
                    #expect(await Self.sqlState(backend, "SELECT * FROM public.\(table) LIMIT 1") == "42501", "\(label): \(table)")
                }
            }
        }
    }

    // MARK: 11. No code or refresh token in a log line, an answer or a database dump

    /// `secret` as text, as hex (how a dump shows bytea), and inside base64 and base64url at each
    /// of the three alignments (how a JWS or a binary column would carry it).
    static func spellings(of secret: String) -> [String] {
        let bytes = Data(secret.utf8)
        var forms = [secret, bytes.map { String(format: "%02x", $0) }.joined()]
        for shift in 0..<3 {
            let padded = Data(repeating: 0x20, count: shift) + bytes
            let skip = shift == 0 ? 0 : shift + 1
            forms.append(String(padded.base64EncodedString().dropFirst(skip).dropLast(4)))
            forms.append(String(Base64URL.encode(padded).dropFirst(skip).dropLast(3)))
        }
        return forms
    }

    /// No secret in any spelling, nothing shaped like the stand-in's codes and tokens (a letter and
    /// 64 hex digits: access tokens too), and no JWS (id_tokens, client secrets).
    static func expectNothingSecret(in texts: [String], _ what: String, secrets: [String], sourceLocation: SourceLocation = #_sourceLocation) throws {
        let opaque = try Regex("(?:^|[^A-Za-z0-9_-])[acr][0-9a-f]{64}(?:$|[^A-Za-z0-9_-])")
        let jws = try Regex("eyJ[A-Za-z0-9_-]*\\.eyJ[A-Za-z0-9_-]*\\.")
        for text in texts {
            for secret in secrets {
                for form in spellings(of: secret) where text.contains(form) {
                    Issue.record("\(what) holds a secret (\(form.prefix(12))…): \(text.prefix(400))", sourceLocation: sourceLocation)
                }
            }
            if let match = text.firstMatch(of: opaque) {
                Issue.record("\(what) holds a code or token: \(text[match.range])", sourceLocation: sourceLocation)
            }
            if let match = text.firstMatch(of: jws) {
                Issue.record("\(what) holds a JWS: \(text[match.range].prefix(80))", sourceLocation: sourceLocation)
            }
        }
    }

    /// `pg_dump` of the whole database (schema and rows), as an operator would take a backup.
    static func dump(_ database: PostgresClient.Configuration) async throws -> String {
        let socket = try #require(database.unixSocketPath)
        let port = try #require(socket.split(separator: ".").last.map(String.init))
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []).sorted { (Int($0) ?? 0) > (Int($1) ?? 0) }
        var candidates: [String?] = [ProcessInfo.processInfo.environment["SIWA_POSTGRES_BIN"].map { "\($0)/pg_dump" }]
        candidates += versions.map { "/usr/lib/postgresql/\($0)/bin/pg_dump" }
        candidates.append(Executables.find("pg_dump"))
        let binary = try #require(candidates.compactMap { $0 }.first { FileManager.default.isExecutableFile(atPath: $0) }, "no pg_dump")
        let result = try await Subprocess.run(
            binary,
            [
                "--no-owner", "--no-privileges", "--host", (socket as NSString).deletingLastPathComponent, "--port", port, "--username", database.username,
                "--dbname", try #require(database.database),
            ], environment: ["PATH": "/usr/bin:/bin"])
        #expect(result.succeeded, "pg_dump: \(result.combinedOutput.suffix(2000))")
        return result.standardOutput
    }

    @Test(
        "Sign-in with a code, the account's deletion and the token's revocation at Apple: neither the code nor the refresh token (nor any token or id_token) is in a log line, an API answer or a pg_dump of the database"
    )
    func noCodeOrRefreshTokenAnywhere() async throws {
        let signer = ExchangeFixture.signer
        let aud = SignInCompletionTests.clientID
        let sub = "001.custody.1"
        let apple = try await StandInCredentials.start(signer: signer, clientIDs: [aud])
        let database = try await TestCluster.shared.makeDatabase()
        let h = try await Harness.start(signer: signer, database: database) { $0.appleCredentials = apple.credentials }
        let f = ExchangeFixture(h: h, apple: apple)
        let token = try await API.token(h, APIScope.allCases)
        var answers: [TestServer.Answer] = []
        func call(_ method: HTTPMethod, _ path: String, _ body: JSONValue? = nil) async throws -> TestServer.Answer {
            let answer = try await API.call(h, method, path, token: token, body: body)
            answers.append(answer)
            return answer
        }

        let code = f.code(sub: sub, email: "custody@privaterelay.appleid.com", isPrivateEmail: true)
        let created = try await call(.POST, "/v1/sessions", ["authorization_code": .string(code)])
        #expect(created.status == 201, "\(created.body)")
        let session = try #require(created.json?["id"]?.stringValue)
        let kept = try #require(try await f.keptTokens(sub: sub).first)
        let refreshToken = try f.cipher.decrypt(kept.ciphertext, owner: AppleTokenOwner(aud: aud, sub: sub))
        let secrets = [code, refreshToken]
        let reads = [
            "/v1/sessions/\(session)", "/v1/accounts/\(aud)/\(sub)", "/v1/accounts/\(aud)/\(sub)/sessions", "/v1/accounts/\(aud)/\(sub)/timeline",
            "/v1/notifications", "/v1/rejections", "/v1/transfers", "/v1/alerts", "/metrics", "/health/ready",
        ]
        for path in reads { #expect(try await call(.GET, path).status == 200, "\(path)") }

        let kept1 = try await Self.dump(database)
        #expect(kept1.contains(kept.ciphertext), "the dump holds apple_tokens (the ciphertext)")
        try Self.expectNothingSecret(in: [kept1.replacingOccurrences(of: kept.ciphertext, with: "<ciphertext>")], "pg_dump after sign-in", secrets: secrets)

        // The user deletes their account: the kept token is revoked at Apple.
        let erased = try await call(.DELETE, "/v1/accounts/\(aud)/\(sub)")
        #expect(erased.status == 200 && erased.json?["apple_revocations"] == .number(1), "\(erased.body)")
        var configuration = EffectWorkers.Configuration()
        configuration.effects.workers = 1
        configuration.lanes.apple = AppleRevocations(client: apple.credentials.client(), cipher: f.cipher)
        let workers = EffectWorkers(configuration: configuration, store: EffectStore(client: h.server.client, logger: h.logs.logger()), logger: h.logs.logger())
        #expect(try await #require(workers.deliverer(.appleRevocations)).runOnce(http: .shared).claimed == 1)
        #expect(f.standIn.revocations.contains { $0.token == refreshToken && $0.status == 200 }, "Apple was sent the very token searched for")
        for path in reads.dropFirst() { _ = try await call(.GET, path) }
        let timeline = try await call(.GET, "/v1/accounts/\(aud)/\(sub)/timeline")
        #expect(timeline.json?["apple_calls"]?.arrayValue?.count == 2, "the exchange and the revocation, on record: \(timeline.body)")

        let afterRevocation = try await Self.dump(database)
        try Self.expectNothingSecret(in: [afterRevocation], "pg_dump after the revocation", secrets: secrets)
        try Self.expectNothingSecret(in: answers.map { "\($0.headers) \($0.body)" }, "an API answer", secrets: secrets)
        #expect(h.logs.all.count > 0)
        try Self.expectNothingSecret(in: h.logs.all, "a log line", secrets: secrets)
        await f.stop()
    }
}
