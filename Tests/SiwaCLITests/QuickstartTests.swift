import Foundation
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The README's Quickstart as an adopter follows it, on the embedded database: the blocks marked
/// `<!-- tested: … -->` run as written, with the debug binary in place of the release build and
/// free ports in place of 8080 and 8081.
@Suite("The README's Quickstart", .timeLimit(.minutes(10)))
struct QuickstartTests {
    @Test("Quickstart: a test notification is accepted and listed; a session from keys id-token is revoked by consent-revoked; a sign-in with a code, and the account's deletion revokes its token at the stand-in; the app moved to another team re-keys the user and their session")
    func quickstart() async throws {
        let blocks = try IntegrationGuideTests.testedBlocks(in: "README.md")
        #expect(
            Set(blocks.keys) == ["quickstart", "quickstart-revoked", "standin", "try-apple", "try-apple-revoked", "try-transfer", "try-suppress", "try-suppressed"],
            "README.md's tested blocks changed: run each new one here")
        var (port, adminPort, standInBase) = (0, 0, "")  // the servers', once they have bound them
        func block(_ name: String) throws -> String {
            try #require(blocks[name]?.code, "README.md has no tested block \(name)")
                .replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(port)")
                .replacingOccurrences(of: "127.0.0.1:8081", with: "127.0.0.1:\(adminPort)")
                .replacingOccurrences(of: "http://127.0.0.1:8090", with: standInBase)
        }

        let directory = try TestBinary.makeDirectory("quickstart")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The second terminal as a new one: the system's PATH and the tools the README uses (curl,
        // jq), not the binary: its block must put the build on PATH itself, as it says.
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("SIWA_") && $0.key != "DATABASE_URL" }
        let shell = IntegrationGuideTests.Shell(directory: directory, environment: environment.merging([
            "PATH": "/usr/local/bin:/usr/bin:/bin"
        ]) { $1 })

        // Steps 1 and 2, with the debug binary, and step 6 (the stand-in) with the server started
        // once, with the credentials of the restart. The callback endpoint only tells the test
        // when an effect is committed (its callback is enqueued in the effect's transaction).
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "siwa-keys"], directory: directory).status == 0)
        // Step 6 as written, in a new terminal: a fresh shell that has only the system's PATH, with
        // the release build's place holding the binary under test.
        try FileManager.default.createDirectory(atPath: "\(directory)/.build/release", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: "\(directory)/.build/release/siwa-events", withDestinationPath: TestBinary.url.path)
        let standIn = try await StandInProcess.start(block: try #require(blocks["standin"]?.code), port: 8090, in: directory)
        defer { standIn.process.signal(SIGKILL) }
        standInBase = standIn.base
        // As the README writes it: readable by its owner alone, like the .p8 beside it.
        #expect(try await TestBinary.run(["apple", "token-key", "--output", "siwa-keys/token-key"], directory: directory).status == 0)
        let keyFile = try FileManager.default.attributesOfItem(atPath: "\(directory)/siwa-keys/token-key")
        #expect((keyFile[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let tokenKey = try String(contentsOfFile: "\(directory)/siwa-keys/token-key", encoding: .utf8)
        let endpoint = try await CallbackEndpoint.start()
        defer { Task { await endpoint.stop() } }
        let serving = try await TestBinary.startServing(
            environment: [
                "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_JWKS_URL": "file://\(directory)/siwa-keys/jwks.json",
                "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": TestWebhooks.secret,
                "SIWA_APPLE_TEAM_ID": StandInProcess.teamID, "SIWA_APPLE_KEY_ID": StandInProcess.keyID,
                "SIWA_APPLE_PRIVATE_KEY_FILE": "siwa-keys/AuthKey_\(StandInProcess.keyID).p8", "SIWA_APPLE_TOKEN_KEYS_FILE": "siwa-keys/token-key",
                "SIWA_APPLE_AUTH_URL": standIn.base, "SIWA_SUPPRESSION_TARGETS": "postmark", "SIWA_POSTMARK_TOKEN": "standin-postmark-token",
                "SIWA_POSTMARK_URL": standIn.base + "/postmark",
            ], unsetting: { $0.hasPrefix("SIWA_") || $0 == "DATABASE_URL" }, directory: directory)
        let server = serving.process
        defer { server.signal(SIGTERM) }
        (port, adminPort) = (serving.port, serving.adminPort)
        // The start says which optional parts are on, and how, without a secret.
        try #require(await serving.output.wait(forLineWith: ["optional parts", "team \(StandInProcess.teamID)", "1 key(s)"], within: .seconds(30)), "\(serving.output.text)")
        let parts = serving.output.text.split(separator: "\n").first { $0.contains("optional parts") }.map(String.init) ?? ""
        #expect(parts.contains("endpoint_check=off") && parts.contains("127.0.0.1") && parts.contains("apple_token_validation=off"), "\(parts)")

        // Steps 3 to 5.
        let steps = try await shell.run(try block("quickstart"))
        #expect(steps.status == 0, "\(steps.stdout) \(steps.stderr)")
        let lines = steps.stdout.split(separator: "\n")
        #expect(lines.first?.hasPrefix(#"200 {"id":"#) == true && lines.first?.contains(#""status":"accepted""#) == true, "\(steps.stdout)")
        #expect(lines.contains { $0.contains("email-disabled") }, "notifications list: \(steps.stdout)")
        #expect(lines.last?.contains(#""status":"accepted""#) == true, "\(steps.stdout)")

        // Both effects committed: email-disabled's callback, then consent-revoked's.
        try #require(await endpoint.arrived.wait(until: 2, within: .seconds(60)))
        let revoked = try await shell.run(try block("quickstart-revoked"))
        #expect(revoked.status == 0 && revoked.stdout == #"{"active":false,"revoked_reason":"consent-revoked"}"# + "\n", "\(revoked.stdout) \(revoked.stderr)")

        // Steps 7 and 8; then, once the worker logged the revocation taken, what the README shows.
        let deleted = try await shell.run(try block("try-apple"))
        #expect(
            deleted.status == 0 && deleted.stdout == #"{"sub":"001234.abcdef.0002","active":true}"# + "\n" + #"{"revoked_sessions":1,"apple_revocations":1}"# + "\n",
            "\(deleted.stdout) \(deleted.stderr)")
        try #require(await serving.output.wait(forLineWith: ["Apple token revocation", "outcome=delivered"], within: .seconds(60)), "\(serving.output.text)")
        let shown = try await shell.run(try block("try-apple-revoked"))
        #expect(
            shown.status == 0
                && shown.stdout == #"{"state":"completed","client_id":"com.example.app","last_status":200}"# + "\n"
                    + #"{"token_type_hint":"refresh_token","outcome":"revoked"}"# + "\n",
            "\(shown.stdout) \(shown.stderr)")

        // Steps 9 and 10: the one remaining user moves to the recipient team, their session with them.
        let moved = try await shell.run(try block("try-transfer"))
        let movedLines = moved.stdout.split(separator: "\n").map(String.init)
        #expect(moved.status == 0 && movedLines.count == 3, "\(moved.stdout) \(moved.stderr)")
        #expect(movedLines.first == "1 of 1 users have a transfer_sub for team TEAMB23456", "\(moved.stdout)")
        #expect(movedLines.dropFirst().first == "1 of 1 transfer_subs exchanged (1 account re-keyed)", "\(moved.stdout)")
        let newSub = movedLines.last ?? ""
        #expect(newSub.wholeMatch(of: /[0-9]{6}\.[0-9a-f]{32}\.[0-9]{4}/) != nil && newSub != "001234.abcdef.0001", "\(moved.stdout)")
        // The user's old sub still finds them: the account answers with the sub it has now, and lists the old one.
        // So does the history search; a notification's verification shows the sub its token was signed with.
        let lookup = try await shell.run(
            """
            READER=$(siwa-events tokens create --name old-sub --scope accounts:read --scope notifications:read)
            API=http://127.0.0.1:\(adminPort)/v1
            curl -s $API/accounts/com.example.app/001234.abcdef.0001 -H "Authorization: Bearer $READER" | jq -c '{sub, previous_subs}'
            curl -s "$API/notifications?sub=001234.abcdef.0001" -H "Authorization: Bearer $READER" | jq -c '[.items[].sub] | unique'
            JTI=$(curl -s "$API/notifications?sub=001234.abcdef.0001" -H "Authorization: Bearer $READER" | jq -r '.items[0].jti')
            curl -s $API/notifications/$JTI -H "Authorization: Bearer $READER" | jq -c '{sub, signed: .verification.sub}'
            """)
        #expect(
            lookup.stdout == #"{"sub":"\#(newSub)","previous_subs":["001234.abcdef.0001"]}"# + "\n" + #"["\#(newSub)"]"# + "\n"
                + #"{"sub":"\#(newSub)","signed":"001234.abcdef.0001"}"# + "\n",
            "\(lookup.stdout) \(lookup.stderr)")

        // Steps 11 and 12: the address suppressed at the stand-in's Postmark once its lane
        // delivered, then lifted.
        let delivered = ["suppression at postmark", "outcome=delivered"]
        let before = serving.output.text.split(separator: "\n").count { line in delivered.allSatisfy { line.contains($0) } }
        let disabled = try await shell.run(try block("try-suppress"))
        #expect(disabled.status == 0 && disabled.stdout.isEmpty, "\(disabled.stdout) \(disabled.stderr)")
        try #require(await serving.output.wait(forLineWith: delivered, count: before + 1, within: .seconds(60)), "\(serving.output.text)")
        let suppressed = try await shell.run(try block("try-suppressed"))
        #expect(suppressed.status == 0 && suppressed.stdout == #"["q7x2m@privaterelay.appleid.com"]"# + "\n", "\(suppressed.stdout) \(suppressed.stderr)")
        try #require(await serving.output.wait(forLineWith: delivered, count: before + 2, within: .seconds(60)), "\(serving.output.text)")
        // Step 12's "the same command shows []".
        let shownAgain = try #require(blocks["try-suppressed"]?.code.split(separator: "\n").first { $0.hasPrefix("curl") }).replacingOccurrences(of: "http://127.0.0.1:8090", with: standInBase)
        let lifted = try await shell.run(shownAgain)
        #expect(lifted.stdout == "[]\n", "\(lifted.stdout) \(lifted.stderr)")
        // The address never reached the server's log.
        #expect(!serving.output.text.contains("q7x2m"), "an address in the log")
        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0)
        // The server's whole log: no code or token of the stand-in's shape (a letter and 64 hex
        // digits), no JWS (identity tokens, client secrets), no key of the keyring.
        let opaque = try Regex("(?:^|[^A-Za-z0-9_-])[acr][0-9a-f]{64}(?:$|[^A-Za-z0-9_-])")
        let jws = try Regex("eyJ[A-Za-z0-9_-]*\\.eyJ[A-Za-z0-9_-]*\\.")
        let key = tokenKey.trimmingCharacters(in: .whitespacesAndNewlines)
        for line in serving.output.text.split(separator: "\n") {
            #expect(line.firstMatch(of: opaque) == nil && line.firstMatch(of: jws) == nil && !line.contains(key), "a secret in the log: \(line)")
        }
    }
}
