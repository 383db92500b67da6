import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// docs/integration.md as an adopter follows it: every block marked `<!-- tested: NAME -->` runs
/// as written (shell in bash with the real binary on PATH, SQL as a backend role), so a guide
/// example that breaks fails the suite.
@Suite("The integration guide's examples", .timeLimit(.minutes(10)))
struct IntegrationGuideTests {
    /// A document's tested blocks by name: (fence language, code).
    static func testedBlocks(in document: String = "docs/integration.md") throws -> [String: (language: String, code: String)] {
        let guide = try String(contentsOf: Repository.root.appendingPathComponent(document), encoding: .utf8)
        var blocks: [String: (String, String)] = [:]
        var lines = guide.split(separator: "\n", omittingEmptySubsequences: false).makeIterator()
        while let line = lines.next() {
            guard line.hasPrefix("<!-- tested: "), line.hasSuffix(" -->") else { continue }
            let name = String(line.dropFirst("<!-- tested: ".count).dropLast(" -->".count))
            guard let fence = lines.next(), fence.hasPrefix("```") else {
                Issue.record("\(document): <!-- tested: \(name) --> is not followed by a fenced block")
                continue
            }
            var code: [Substring] = []
            while let body = lines.next(), body != "```" { code.append(body) }
            blocks[name] = (String(fence.dropFirst(3)), code.joined(separator: "\n"))
        }
        return blocks
    }

    /// Runs shell blocks one after another in `directory`, carrying their variables over (as
    /// one terminal session would), with `siwa-events` on PATH.
    struct Shell {
        let directory: String
        let environment: [String: String]

        struct Output {
            var status: Int32
            var stdout: String
            var stderr: String
        }

        func run(_ code: String, extra: [String: String] = [:]) async throws -> Output {
            let script = "set -euo pipefail\nset -a\nif [ -f .guide-state ]; then . ./.guide-state; fi\n\(code)\nexport -p > .guide-state\n"
            let result = try await Subprocess.run(
                "/bin/bash", ["-c", script], environment: environment.merging(extra) { $1 }, workingDirectory: directory)
            return Output(status: result.status, stdout: result.standardOutput, stderr: result.standardError)
        }
    }

    @Test("Every tested block of docs/integration.md works as written: sessions API, shared database, callback signature checks")
    func guideExamples() async throws {
        let blocks = try Self.testedBlocks()
        let expected: Set<String> = [
            "keys", "api-token", "sign-in", "per-request", "revoke", "after-revoke", "shared-database", "notify-reread", "verify-python", "verify-openssl",
        ]
        #expect(Set(blocks.keys) == expected, "docs/integration.md's tested blocks changed: run each new one here")
        func block(_ name: String) throws -> String { try #require(blocks[name]?.code, "docs/integration.md has no tested block \(name)") }

        let directory = try TestBinary.makeDirectory("guide")
        try FileManager.default.createDirectory(atPath: "\(directory)/bin", withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/bin/siwa-events", withDestinationPath: TestBinary.url.path)
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/docs", withDestinationPath: Repository.root.appendingPathComponent("docs").path)
        let databaseURL = try await TestBinary.databaseURL()
        let endpoint = try await CallbackEndpoint.start()
        defer { Task { await endpoint.stop() } }
        let shellEnvironment = ProcessInfo.processInfo.environment.merging([
            "PATH": "\(directory)/bin:" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"), "DATABASE_URL": databaseURL,
        ]) { $1 }

        let keys = try await Shell(directory: directory, environment: shellEnvironment).run(try block("keys"))
        #expect(keys.status == 0, "\(keys.stderr)")
        let serving = try await TestBinary.startServing(
            environment: [
                "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_JWKS_URL": "file://\(directory)/siwa-keys/jwks.json",
                "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
            ], directory: directory)
        let (server, port, adminPort) = (serving.process, serving.port, serving.adminPort)
        defer {
            server.signal(SIGTERM)
        }
        let shell = Shell(directory: directory, environment: shellEnvironment.merging([
            "SIWA_PUBLIC": "http://127.0.0.1:\(port)", "SIWA_ADMIN": "http://127.0.0.1:\(adminPort)",
        ]) { $1 })

        // Recipe 1: the sessions API.
        let token = try await shell.run(try block("api-token") + "\necho \"$SIWA_TOKEN\"")
        #expect(token.status == 0 && token.stdout.hasPrefix("siwa_"), "\(token.stdout) \(token.stderr)")
        let signIn = try await shell.run(try block("sign-in"))
        #expect(signIn.status == 0, "\(signIn.stderr)")
        let sessionID = signIn.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(UUID(uuidString: sessionID) != nil, "sign-in printed \(signIn.stdout), \(signIn.stderr)")
        let active = try await shell.run(try block("per-request"))
        #expect(active.status == 0 && active.stdout == "true\n", "\(active.stdout) \(active.stderr)")
        let revoke = try await shell.run(try block("revoke"))
        #expect(revoke.status == 0 && revoke.stdout.contains("accepted"), "\(revoke.stdout) \(revoke.stderr)")
        // The callback is enqueued in the effect's transaction: once it arrives, the effect is committed.
        try #require(await endpoint.arrived.wait(until: 1, within: .seconds(60)))
        let revoked = try await shell.run(try block("after-revoke"))
        #expect(revoked.status == 0 && revoked.stdout.contains(#"{"active":false,"revoked_reason":"consent-revoked"}"#), "\(revoked.stdout) \(revoked.stderr)")

        // Recipe 3: the delivered callback passes both verifiers; a changed body fails both.
        let delivered = try #require(endpoint.received.first)
        let headers = [
            "SIWA_CALLBACK_SECRET": TestWebhooks.secret, "WEBHOOK_ID": delivered.headers["webhook-id"] ?? "", "WEBHOOK_TIMESTAMP": delivered.headers["webhook-timestamp"] ?? "",
            "WEBHOOK_SIGNATURE": delivered.headers["webhook-signature"] ?? "",
        ]
        try Data(delivered.body).write(to: URL(fileURLWithPath: "\(directory)/body.json"))
        let python = try await shell.run(try block("verify-python"), extra: headers)
        #expect(python.status == 0, "\(python.stderr)")
        let event = JSONValue.parse(Data(python.stdout.utf8))
        #expect(event?["type"] == .string("consent-revoked") && event?["webhook_id"] == .string(headers["WEBHOOK_ID"] ?? "-"), "\(python.stdout)")
        let openssl = try await shell.run(try block("verify-openssl"), extra: headers)
        #expect(openssl.status == 0 && openssl.stdout == "verified\n", "\(openssl.stdout) \(openssl.stderr)")
        try Data(delivered.bodyText.replacingOccurrences(of: "consent-revoked", with: "email-enabled").utf8)
            .write(to: URL(fileURLWithPath: "\(directory)/body.json"))
        #expect(try await shell.run(try block("verify-python"), extra: headers).status == 1)
        #expect(try await shell.run(try block("verify-openssl"), extra: headers).status == 1)

        // Recipe 2: the shared database, as the role `db grant-backend` prepares.
        let role = "guide_backend_\(UUID().uuidString.prefix(6).lowercased())"
        try await TestBinary.withDatabase(databaseURL) { client in _ = try await client.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN")) }
        let granted = try await TestBinary.run(["db", "grant-backend", "--role", role], environment: ["DATABASE_URL": databaseURL], directory: directory)
        #expect(granted.status == 0, "\(granted.stderr)")
        let statements = try block("shared-database").components(separatedBy: ";\n").map {
            $0.split(separator: "\n").filter { !$0.hasPrefix("--") }.joined(separator: "\n").trimmingCharacters(in: CharacterSet.whitespacesAndNewlines.union(CharacterSet(charactersIn: ";")))
        }.filter { !$0.isEmpty }
        try #require(statements.count == 4, "the shared-database block's statements: \(statements)")
        let roleURL = databaseURL.replacingOccurrences(of: "postgres://\(try #require(URLComponents(string: databaseURL)?.user))@", with: "postgres://\(role)@")
        try await TestBinary.withDatabase(roleURL) { backend in
            func rows(_ sql: String, _ values: [any PostgresEncodable & Sendable]) async throws -> [PostgresRow] {
                var binds = PostgresBindings()
                for value in values { try binds.append(value) }
                var result: [PostgresRow] = []
                for try await row in try await backend.query(PostgresQuery(unsafeSQL: sql, binds: binds)) { result.append(row) }
                return result
            }
            let created = try await rows(statements[0], ["com.example.app", "001234.abcdef.0002", Int(Date().timeIntervalSince1970)])
            let session = try #require(try created.first?.decode(UUID.self))
            #expect(try await rows(statements[1], [session]).count == 1)
            // The address the identity token carried, forwarding on: may be emailed.
            let email = try await rows(statements[2], ["com.example.app", "001234.abcdef.0001"])
            #expect(try email.first?.decode(String?.self) == "x7k2q@privaterelay.appleid.com")
            _ = try await rows(statements[3], [session])
            #expect(try await rows(statements[1], [session]).isEmpty)

            // Any role can NOTIFY siwa_effects with a payload of its choosing: the guide's handler
            // re-reads, and the database says the account is not deleted.
            _ = try await rows(#"NOTIFY siwa_effects, '{"type":"account-delete","aud":"com.example.app","sub":"001234.abcdef.0002"}'"#, [])
            let reread = try block("notify-reread").split(separator: "\n").filter { !$0.hasPrefix("--") }.map { String($0.prefix { $0 != ";" }) }
            try #require(reread.count == 2, "\(reread)")
            let revoked = try await rows(reread[0], ["com.example.app", "001234.abcdef.0002"])
            #expect(try revoked.map { try $0.decode(UUID.self) } == [session], "the logged-out session, and only it")
            let account = try await rows(reread[1], ["com.example.app", "001234.abcdef.0002"])
            let deletedAt = try account.first.map { try $0.decode((Date?, Date?).self).0 } ?? nil
            #expect(account.count == 1 && deletedAt == nil, "not deleted, whatever the payload said")
        }
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
    }

    @Test("callbacks redeliver msg_<n> sends the same webhook-id again; an unknown msg id, or a malformed one, is a clear error")
    func redeliverByWebhookID() async throws {
        let directory = try TestBinary.makeDirectory("redeliver")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let databaseURL = try await TestBinary.databaseURL()
        let endpoint = try await CallbackEndpoint.start()
        defer { Task { await endpoint.stop() } }
        let serving = try await TestBinary.startServing(
            environment: [
                "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_JWKS_URL": "file://\(directory)/keys/jwks.json",
                "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
            ], directory: directory)
        let (server, port) = (serving.process, serving.port)
        defer { server.signal(SIGTERM) }
        let environment = ["DATABASE_URL": databaseURL]
        let sent = try await TestBinary.run(
            ["send", "account-delete", "--sub", "001.redeliver.1", "--keys", "keys", "--aud", "com.example.app", "--url", "http://127.0.0.1:\(port)"],
            directory: directory)
        #expect(sent.status == 0, "\(sent.stdout) \(sent.stderr)")
        try #require(await endpoint.arrived.wait(until: 1, within: .seconds(60)))
        let original = try #require(endpoint.received.first?.headers["webhook-id"])
        #expect(original.hasPrefix("msg_"))
        let jti = try #require(JSONValue.parse(Data(sent.stdout.dropFirst(4).utf8))?["id"]?.stringValue, "\(sent.stdout)")

        // Listed webhook-id first; delivered once the deliverer has recorded its attempt.
        // The deliverer logs the delivery once its attempt is recorded.
        let recorded = await serving.output.wait(forLineWith: ["webhook_id=\(original)", "outcome=delivered"], within: .seconds(60))
        #expect(recorded, "no 'callback … outcome=delivered' line for \(original) within 60 s: \(serving.output.text.suffix(3000))")
        let listed = try await TestBinary.run(["callbacks", "list"], environment: environment, directory: directory).stdout
        #expect(listed.hasPrefix("WEBHOOK ID"), "\(listed)")
        #expect(listed.contains("\(original)  ") && listed.contains("completed"), "\(listed)")
        let shown = try await TestBinary.run(["notifications", "show", jti, "--json"], environment: environment, directory: directory)
        #expect(JSONValue.parse(Data(shown.stdout.utf8))?["webhook_id"] == .string(original), "\(shown.stdout) \(shown.stderr)")
        let table = try await TestBinary.run(["notifications", "show", jti], environment: environment, directory: directory)
        let callbackRows = table.stdout.split(separator: "\n").filter { $0.split(separator: " ").dropFirst().first == "callbacks" }
        #expect(table.stdout.contains("WEBHOOK ID") && !callbackRows.isEmpty && callbackRows.allSatisfy { $0.hasPrefix("\(original) ") }, "\(table.stdout)")

        let redelivered = try await TestBinary.run(["callbacks", "redeliver", original], environment: environment, directory: directory)
        #expect(redelivered.status == 0 && redelivered.stdout.contains("queued 1 callback"), "\(redelivered.stdout) \(redelivered.stderr)")
        try #require(await endpoint.arrived.wait(until: 2, within: .seconds(60)))
        let again = endpoint.received[1]
        #expect(again.headers["webhook-id"] == original)
        #expect(again.body == endpoint.received[0].body)
        #expect(TestWebhooks.verifies(again, secret: TestWebhooks.secret))

        let unknown = try await TestBinary.run(["callbacks", "redeliver", "msg_987654"], environment: environment, directory: directory)
        #expect(unknown.status == 1 && unknown.stderr.contains("no callback msg_987654"), "\(unknown.stderr)")
        let malformed = try await TestBinary.run(["callbacks", "redeliver", "message-12"], environment: environment, directory: directory)
        #expect(malformed.status == 64 && malformed.stderr.contains("webhook-id like msg_12"), "\(malformed.stderr)")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
    }

    @Test("keys id-token: its token passes the sessions verifier with its nonce, fails with another; bad flags name the flag")
    func idTokenFlags() async throws {
        let directory = try TestBinary.makeDirectory("idtoken")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let made = try await TestBinary.run(
            ["keys", "id-token", "--keys", "keys", "--aud", "com.example.app", "--sub", "001.token.1", "--nonce", "n-0123"], directory: directory)
        #expect(made.status == 0, "\(made.stderr)")
        let keySet = try AppleKeySet.parse(Data(contentsOf: URL(fileURLWithPath: "\(directory)/keys/jwks.json")))
        let verifier = IdentityTokenVerifier(clientIDs: ["com.example.app"])
        let identity = try verifier.verify(made.stdout.trimmingCharacters(in: .whitespacesAndNewlines), keys: keySet, nonce: "n-0123", now: Date())
        #expect(identity.sub == "001.token.1" && identity.clientID == "com.example.app")
        #expect(throws: VerificationError.self) {
            try verifier.verify(made.stdout.trimmingCharacters(in: .whitespacesAndNewlines), keys: keySet, nonce: "another", now: Date())
        }

        let cases: [([String], String)] = [
            (["--keys", "nowhere", "--aud", "com.example.app", "--sub", "s"], "--keys: cannot read nowhere/private-key.pem"),
            (["--keys", "keys", "--aud", "com.example.app"], "--sub"),
            (["--keys", "keys", "--aud", "", "--sub", "s"], "--aud must be a client ID"),
            (["--keys", "keys", "--aud", "com.example.app", "--sub", "s", "--private"], "--private needs --email"),
            (["--keys", "keys", "--aud", "com.example.app", "--sub", "s", "--nonce", ""], "--nonce must not be empty"),
        ]
        for (arguments, message) in cases {
            let run = try await TestBinary.run(["keys", "id-token"] + arguments, directory: directory)
            #expect(run.status == 64 && run.stderr.contains(message), "\(arguments): \(run.status) \(run.stderr)")
            #expect(run.stdout.isEmpty)
        }
    }
}
