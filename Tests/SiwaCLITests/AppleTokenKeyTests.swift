import Crypto
import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// `SIWA_APPLE_TOKEN_KEYS` through the real binary: a keyring that cannot open a stored token stops
/// `serve`; `apple reencrypt` moves every token under the new key, after which the old one can go.
@Suite("Apple token keys: rotation without downtime, and a wrong key refused at start", .timeLimit(.minutes(10)))
struct AppleTokenKeyTests {
    /// Tokens kept under `cipher`, as sign-ins would leave them (two kept, one pending revocation).
    static func keepTokens(_ client: PostgresClient, cipher: AppleTokenCipher) async throws -> [String: String] {
        var tokens: [String: String] = [:]
        for sub in ["001.rot.1", "001.rot.2", "001.rot.3"] {
            let token = "r" + UUID().uuidString.lowercased() + ".0.rot"
            tokens[sub] = token
            let ciphertext = cipher.encrypt(token, owner: AppleTokenOwner(aud: "com.example.deploy", sub: sub))
            try await client.query("INSERT INTO accounts (aud, sub) VALUES ('com.example.deploy', \(sub))")
            if sub == "001.rot.3" {
                try await client.query(
                    """
                    INSERT INTO jobs (lane, kind, aud, sub, target, payload) VALUES ('apple_revocations', 'refresh_token', 'com.example.deploy', \(sub),
                        'com.example.deploy', \(ciphertext))
                    """)
            } else {
                try await client.query(
                    """
                    INSERT INTO apple_tokens (aud, sub, client_id, token, fingerprint)
                    VALUES ('com.example.deploy', \(sub), 'com.example.deploy', \(ciphertext), \(AppleAuthRecord.fingerprint(token)))
                    """)
            }
        }
        return tokens
    }

    /// Every stored ciphertext with its owner, kept tokens and pending revocations alike.
    static func stored(_ client: PostgresClient) async throws -> [(sub: String, ciphertext: String)] {
        var rows: [(String, String)] = []
        for try await row in try await client.query(
            "SELECT sub, token FROM apple_tokens UNION ALL SELECT sub, payload FROM jobs WHERE lane = 'apple_revocations' ORDER BY 1"
        ).decode((String, String).self) { rows.append(row) }
        return rows
    }

    @Test("a keyring without a stored token's key stops serve naming SIWA_APPLE_TOKEN_KEYS; reencrypt moves every token to the new key; the old key can then be dropped")
    func rotation() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let databaseURL = "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"
        #expect(try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": databaseURL], directory: keys.directory).status == 0)
        let old = AppleTokenCipher.generateKey()
        let new = AppleTokenCipher.generateKey()
        let oldCipher = try AppleTokenCipher(keys: old)
        let newCipher = try AppleTokenCipher(keys: new)

        let client = PostgresClient(configuration: database)
        let running = Task { await client.run() }
        defer { running.cancel() }
        let tokens = try await Self.keepTokens(client, cipher: oldCipher)

        let p8 = "\(keys.directory)/AuthKey.p8"
        try P256.Signing.PrivateKey().pemRepresentation.write(toFile: p8, atomically: true, encoding: .utf8)
        func environment(_ keyring: String) -> [String: String] {
            [
                "DATABASE_URL": databaseURL, "SIWA_EMBEDDED_DATABASE": "off", "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
                "SIWA_APPLE_TEAM_ID": "TEAMID1234", "SIWA_APPLE_KEY_ID": "KEYID12345", "SIWA_APPLE_PRIVATE_KEY_FILE": p8,
                "SIWA_APPLE_TOKEN_KEYS": keyring, "SIWA_APPLE_AUTH_URL": "http://127.0.0.1:9",
            ]
        }

        // Only the new key: the stored tokens could never be revoked, so serve refuses to start.
        let refused = try await TestBinary.run(["serve"], environment: environment(new), directory: keys.directory)
        #expect(refused.status == 78, "status \(refused.status): \(refused.stderr)")
        #expect(refused.stderr.contains("SIWA_APPLE_TOKEN_KEYS (--apple-token-keys): holds no key \(oldCipher.currentKeyID), under which 3 kept Apple token(s) are encrypted"), "\(refused.stderr)")

        // The new key first, the old one after: serve runs, and reencrypt moves everything meanwhile.
        let serving = try await TestBinary.startServing(environment: environment("\(new) \(old)"), directory: keys.directory)
        let rotated = try await TestBinary.run(["apple", "reencrypt"], environment: ["DATABASE_URL": databaseURL, "SIWA_APPLE_TOKEN_KEYS": "\(new) \(old)"], directory: keys.directory)
        #expect(rotated.status == 0, "\(rotated.stderr)")
        #expect(rotated.stdout.contains("re-encrypted 3 under key \(newCipher.currentKeyID)"), "\(rotated.stdout)")
        #expect(rotated.stdout.contains("unused now, can be dropped from SIWA_APPLE_TOKEN_KEYS: \(oldCipher.currentKeyID)"), "\(rotated.stdout)")
        for (sub, ciphertext) in try await Self.stored(client) {
            #expect(AppleTokenCipher.keyID(of: ciphertext) == newCipher.currentKeyID)
            #expect(try newCipher.decrypt(ciphertext, owner: AppleTokenOwner(aud: keys.aud, sub: sub)) == tokens[sub])
        }
        // Run again: nothing left to move.
        let again = try await TestBinary.run(["apple", "reencrypt"], environment: ["DATABASE_URL": databaseURL, "SIWA_APPLE_TOKEN_KEYS": "\(new) \(old)"], directory: keys.directory)
        #expect(again.stdout.contains("re-encrypted 0 under key"), "\(again.stdout)")
        serving.process.signal(SIGTERM)
        #expect(await serving.process.waitForExit() == 0)

        // The old key dropped: serve starts.
        let restarted = try await TestBinary.startServing(environment: environment(new), directory: keys.directory)
        restarted.process.signal(SIGTERM)
        #expect(await restarted.process.waitForExit() == 0)
        let audit = try await TestBinary.run(["audit", "list", "--json"], environment: ["DATABASE_URL": databaseURL], directory: keys.directory)
        #expect(audit.stdout.contains("apple_tokens.reencrypt"), "\(audit.stdout)")
        for log in [refused.stderr, rotated.stdout, rotated.stderr, serving.output.text, restarted.output.text] {
            for token in tokens.values { #expect(!log.contains(token)) }
            #expect(!log.contains(old) && !log.contains(new), "a key leaked: \(log)")
        }
    }

    @Test("token-key --output writes a key the keyring takes, readable by its owner alone; a symlink there is refused, naming --output, and nothing is written")
    func tokenKeyToAFile() async throws {
        let directory = try TestBinary.makeDirectory("token-key")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let written = try await TestBinary.run(["apple", "token-key", "--output", "key"], directory: directory)
        #expect(written.status == 0 && written.stdout.isEmpty, "\(written.stdout) \(written.stderr)")
        let attributes = try FileManager.default.attributesOfItem(atPath: "\(directory)/key")
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let key = try String(contentsOfFile: "\(directory)/key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect((try? AppleTokenCipher(keys: key)) != nil, "not a key the keyring takes: \(key)")

        try FileManager.default.createSymbolicLink(atPath: "\(directory)/link", withDestinationPath: "\(directory)/elsewhere")
        let refused = try await TestBinary.run(["apple", "token-key", "--output", "link"], directory: directory)
        #expect(refused.status == 1 && refused.stderr.contains("--output") && refused.stderr.contains("symbolic link"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/elsewhere"))
    }
}
