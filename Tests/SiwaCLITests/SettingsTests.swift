import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The settings' single definition: docs/reference.md's table, `--help` and the flags all come from it.
@Suite("Settings: one definition each", .timeLimit(.minutes(10)))
struct SettingsTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test("docs/reference.md's configuration table is the one the settings' definitions make")
    func referenceTable() throws {
        let document = "docs/reference.md"
        let reference = try String(contentsOf: Self.packageRoot.appendingPathComponent(document), encoding: .utf8)
        let (begin, end) = Settings.tableMarkers
        let start = try #require(reference.range(of: begin), "\(document) lacks \(begin)")
        let stop = try #require(reference.range(of: end, range: start.upperBound..<reference.endIndex), "\(document) lacks \(end)")
        let table = reference[start.upperBound..<stop.lowerBound].trimmingCharacters(in: .whitespacesAndNewlines)
        let expected = Settings.markdownTable()
        if table != expected {
            let file = Self.packageRoot.appendingPathComponent(".build/settings-table.md")
            try? expected.write(to: file, atomically: true, encoding: .utf8)
            Issue.record("\(document)'s settings table differs from the settings in Sources/SiwaApp/Settings/; the table they make is in \(file.path)")
        }
        let readme = try String(contentsOf: Self.packageRoot.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(!readme.contains(begin), "README.md still holds a settings table: it lives in \(document)")
    }

    @Test("Each setting has a variable and a flag of its own, every group has settings, and `all` lists them group by group")
    func unique() {
        #expect(Set(Settings.all.map(\.variable)).count == Settings.all.count)
        #expect(Set(Settings.all.map(\.flag)).count == Settings.all.count)
        let groups = Settings.all.map(\.group)
        #expect(groups == SettingGroup.allCases.flatMap { group in groups.filter { $0 == group } })
        #expect(Set(groups) == Set(SettingGroup.allCases))
    }

    @Test("SIWA_APPLE_JWKS_URL: plain http only to a loopback address, and a refused URL is shown without its credentials")
    func jwksURLScheme() throws {
        for accepted in ["https://appleid.apple.com/auth/keys", "http://127.0.0.1:8080/auth/keys", "http://localhost/keys", "file:///etc/siwa/jwks.json"] {
            let apple = try AppleSettings(SettingSource(environment: ["SIWA_APPLE_JWKS_URL": accepted]), receiving: false)
            #expect(apple.keys.sourceURL.absoluteString == accepted)
        }
        for refused in ["http://mirror:pw-9@keys.example/auth/keys", "http://127.evil.example/keys", "ftp://keys.example/keys"] {
            do {
                _ = try AppleSettings(SettingSource(environment: ["SIWA_APPLE_JWKS_URL": refused]), receiving: false)
                Issue.record("accepted \(refused)")
            } catch {
                #expect(error.description.contains("SIWA_APPLE_JWKS_URL") && !error.description.contains("pw-9"), "\(error.description)")
            }
        }
    }

    @Test("A flag wins over its variable; a bad flag value names the variable and the flag")
    func flagOverVariable() throws {
        let source = try SettingSource(environment: ["SIWA_PORT": "9000", "SIWA_TRUSTED_PROXIES": "10.0.0.0/8"], arguments: ["--port=9001", "--bundle-ids=a.b,c.d"])
        let config = try Configuration(source)
        #expect(config.http.port == 9001 && config.apple.bundleIDs == ["a.b", "c.d"])
        #expect(config.http.trustedProxies == (try TrustedProxies(parsing: "10.0.0.0/8")))
        #expect(throws: ConfigurationError.self) {
            try Configuration(SettingSource(environment: [:], arguments: ["--workers=0", "--bundle-ids=a.b"]))
        }
        do {
            _ = try Configuration(SettingSource(environment: [:], arguments: ["--workers=0", "--bundle-ids=a.b"]))
        } catch {
            #expect(error.description == "SIWA_WORKERS (--workers): must be an integer between 1 and 64 (got \"0\")")
        }
    }

    @Test("`notifications list --help` lists its own options first, then only the database and logging settings")
    func helpPerCommand() async throws {
        let help = try await TestBinary.run(["notifications", "list", "--help"], directory: "/tmp")
        #expect(help.status == 0)
        let text = help.stdout
        let own = try #require(text.range(of: "--limit"))
        let database = try #require(text.range(of: "--database-url"))
        #expect(own.lowerBound < database.lowerBound, "\(text)")
        for flag in ["--data-dir", "--postgres-bin", "--log-level", "--log-format", "DATABASE_URL", "SIWA_LOG_LEVEL"] {
            #expect(text.contains(flag), "\(flag) missing from\n\(text)")
        }
        for flag in ["--callback-url", "--port", "--spike-window", "--workers"] {
            #expect(!text.contains(flag), "\(flag) listed in\n\(text)")
        }
        #expect(text.split(separator: "\n", omittingEmptySubsequences: false).count < 60, "\(text)")

        let serve = try await TestBinary.run(["help", "serve"], directory: "/tmp")
        #expect(serve.status == 0)
        for setting in Settings.all {
            #expect(serve.stdout.contains("--\(setting.flag) ") && serve.stdout.contains(setting.variable), "\(setting.variable) missing from serve --help")
        }
    }

    @Test("A setting's flag is accepted where the command reads settings; elsewhere, and without a value, it is a usage error")
    func flagsOnTheCommandLine() async throws {
        let badFlag = try await TestBinary.run(["notifications", "list", "--log-level", "loud"], directory: "/tmp")
        #expect(badFlag.status == 78 && badFlag.stderr.contains("SIWA_LOG_LEVEL (--log-level)"), "\(badFlag.stderr)")
        let missing = try await TestBinary.run(["notifications", "list", "--database-url"], directory: "/tmp")
        #expect(missing.status == 64 && missing.stderr.contains("--database-url"), "\(missing.stderr)")
        let unknown = try await TestBinary.run(["notifications", "list", "--no-such-flag", "1"], directory: "/tmp")
        #expect(unknown.status == 64, "\(unknown.stderr)")
        let notHere = try await TestBinary.run(["callbacks", "secret", "--port", "1"], directory: "/tmp")
        #expect(notHere.status == 64, "\(notHere.stderr)")
    }

    @Test("A command reads only its groups' variables: one exported for serve (a lone callback secret) stops serve, not tokens create")
    func otherGroupsVariablesIgnored() async throws {
        let environment = ["DATABASE_URL": try await TestBinary.databaseURL(), "SIWA_CALLBACK_SECRET": TestWebhooks.secret, "SIWA_PORT": "not-a-port"]
        let created = try await TestBinary.run(["tokens", "create", "--name", "exported", "--scope", "sessions:read"], environment: environment, directory: "/tmp")
        #expect(created.status == 0 && created.stdout.hasPrefix("siwa_"), "\(created.stdout) \(created.stderr)")
        let serve = try await TestBinary.run(["serve"], environment: environment.merging(["SIWA_APPLE_BUNDLE_IDS": "com.example.app"]) { $1 }, directory: "/tmp")
        #expect(serve.status == 78 && (serve.stderr.contains("SIWA_CALLBACK_URL") || serve.stderr.contains("SIWA_PORT")), "\(serve.stderr)")
    }

    // MARK: Secrets in files

    /// Writes `value` and a newline to `directory/name`, mode 0600, as a container platform mounts a secret.
    static func secretFile(_ directory: String, _ name: String, _ value: String) throws -> String {
        let path = "\(directory)/\(name)"
        try Data((value + "\n").utf8).write(to: URL(fileURLWithPath: path))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)
        return path
    }

    @Test("serve reads DATABASE_URL, the callback secret and the metrics token from the files their _FILE variables name")
    func secretsFromFiles() async throws {
        let directory = try TestBinary.makeDirectory("secret-files")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let token = "metrics-token-from-a-file-0123"
        let environment = [
            "DATABASE_URL_FILE": try Self.secretFile(directory, "database-url", try await TestBinary.databaseURL()),
            "SIWA_EMBEDDED_DATABASE": "off",
            "SIWA_CALLBACK_URL": "http://127.0.0.1:9/siwa", "SIWA_CALLBACK_SECRET_FILE": try Self.secretFile(directory, "callback-secret", TestWebhooks.secret),
            "SIWA_METRICS_TOKEN_FILE": try Self.secretFile(directory, "metrics-token", token),
            "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
        ]
        let serving = try await TestBinary.startServing(
            environment: environment, unsetting: { $0.hasPrefix("SIWA_") || $0 == "DATABASE_URL" }, directory: directory)
        let (server, adminPort) = (serving.process, serving.adminPort)
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(adminPort)/metrics")
        #expect(try await http.execute(request, timeout: .seconds(5)).status.code == 401)
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        #expect(try await http.execute(request, timeout: .seconds(5)).status.code == 200, "the token is the file's contents without its newline")
        try await http.shutdown()
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
    }

    @Test("A secret and its _FILE both set, or a _FILE naming a missing or empty file, stops the command (exit 78) naming the variables and the path")
    func secretFileErrors() async throws {
        let directory = try TestBinary.makeDirectory("secret-file-errors")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let secret = try Self.secretFile(directory, "callback-secret", TestWebhooks.secret)
        let both = try await TestBinary.run(
            ["serve"], environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_CALLBACK_SECRET": TestWebhooks.secret, "SIWA_CALLBACK_SECRET_FILE": secret],
            directory: directory)
        #expect(both.status == 78 && both.stderr.contains("SIWA_CALLBACK_SECRET and SIWA_CALLBACK_SECRET_FILE"), "\(both.stderr)")
        #expect(!both.stderr.contains(TestWebhooks.secret), "\(both.stderr)")

        let missing = try await TestBinary.run(["notifications", "list"], environment: ["DATABASE_URL_FILE": "\(directory)/no-such-file"], directory: directory)
        #expect(missing.status == 78, "\(missing.stderr)")
        #expect(missing.stderr.contains("DATABASE_URL_FILE") && missing.stderr.contains("\(directory)/no-such-file"), "\(missing.stderr)")

        let empty = try Self.secretFile(directory, "empty", "")
        let blank = try await TestBinary.run(["notifications", "list"], environment: ["DATABASE_URL_FILE": empty], directory: directory)
        #expect(blank.status == 78 && blank.stderr.contains("DATABASE_URL_FILE") && blank.stderr.contains(empty) && blank.stderr.contains("empty"), "\(blank.stderr)")

        // The flag's value comes first, as over any variable; another group's secret file is not read.
        let database = try Self.secretFile(directory, "database-url", try await TestBinary.databaseURL())
        let listed = try await TestBinary.run(
            ["notifications", "list"], environment: ["DATABASE_URL_FILE": database, "SIWA_ALERT_SECRET_FILE": "\(directory)/no-such-file"], directory: directory)
        #expect(listed.status == 0, "\(listed.stderr)")
    }

    @Test("--help says a secret's flag is visible to other local users and names its _FILE variable; docs/reference.md's table names it too")
    func helpNamesSecretFiles() async throws {
        let serve = try await TestBinary.run(["serve", "--help"], directory: "/tmp")
        let text = serve.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        let secrets = Settings.all.filter(\.secret)
        #expect(Set(secrets.map(\.variable)) == ["DATABASE_URL", "SIWA_METRICS_TOKEN", "SIWA_APPLE_TOKEN_KEYS", "SIWA_CALLBACK_SECRET", "SIWA_ALERT_SECRET", "SIWA_ALERT_SLACK_URL",
            "SIWA_POSTMARK_TOKEN", "SIWA_SENDGRID_API_KEY", "SIWA_MAILGUN_API_KEY", "SIWA_RESEND_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        ])
        for setting in secrets {
            #expect(text.contains("(\(setting.variable); default:") && text.contains("prefer \(setting.variable)_FILE, a file holding it"), "\(setting.variable): \(text)")
        }
        #expect(text.components(separatedBy: "other local users can read a flag").count - 1 == secrets.count, "\(text)")
        #expect(Settings.markdownTable().contains("`SIWA_CALLBACK_SECRET` or `SIWA_CALLBACK_SECRET_FILE`"))
    }
}
