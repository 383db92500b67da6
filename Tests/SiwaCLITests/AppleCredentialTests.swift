import Crypto
import Foundation
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The team's credentials for Apple's auth endpoints (`SIWA_APPLE_TEAM_ID`, `SIWA_APPLE_KEY_ID`,
/// `SIWA_APPLE_PRIVATE_KEY_FILE`, `SIWA_APPLE_AUTH_URL`), through the real binary and the local
/// stand-in for Apple's endpoints.
@Suite("Apple credentials", .timeLimit(.minutes(10)))
struct AppleCredentialTests {
    @Test("doctor checks the credentials with one harmless revoke: ok when the stand-in accepts the client secret, FAIL naming invalid_client for another key")
    func doctorChecksCredentials() async throws {
        let directory = try TestBinary.makeDirectory("apple-credentials")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let standIn = try await StandInProcess.start(in: directory)
        defer { standIn.process.signal(SIGKILL) }
        let base = standIn.base
        // Another P-256 key under the same key ID: a secret Apple (the stand-in) does not accept.
        let wrongKey = "\(directory)/wrong.p8"
        try P256.Signing.PrivateKey().pemRepresentation.write(toFile: wrongKey, atomically: true, encoding: .utf8)

        let nothing = TestBinary.RefusingPort()  // doctor's --url: not what this test is about
        func doctor(keyFile: String) async throws -> TestBinary.Run {
            try await TestBinary.run(
                ["doctor", "--url", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--timeout", "5s"],
                environment: [
                    "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_TEAM_ID": "TEAMID1234", "SIWA_APPLE_KEY_ID": "KEYID12345",
                    "SIWA_APPLE_PRIVATE_KEY_FILE": keyFile, "SIWA_APPLE_AUTH_URL": base, "SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey(),
                ], directory: directory)
        }
        let accepted = try await doctor(keyFile: StandInProcess.keyFile(in: directory))
        #expect(accepted.stdout.contains("ok    apple-credentials: \(base) accepted the client secret (team TEAMID1234, key KEYID12345, client com.example.app)"), "\(accepted.stdout)")
        let refused = try await doctor(keyFile: wrongKey)
        #expect(refused.status != 0)
        #expect(refused.stdout.contains("FAIL  apple-credentials: Apple refused the client secret (invalid_client; team TEAMID1234, key KEYID12345"), "\(refused.stdout)")
        // Each check was one revoke at the stand-in, of a token that does not exist.
        let listed = try await TestBinary.run(["standin", "revocations", "--url", base], directory: directory)
        let records = JSONValue.parse(Data(listed.stdout.utf8))?["revocations"]?.arrayValue ?? []
        #expect(records.map { $0["outcome"]?.stringValue } == ["unknown_token", "refused"], "\(listed.stdout)")
        for log in [accepted.stdout, accepted.stderr, refused.stdout, refused.stderr] {
            #expect(!log.contains("PRIVATE KEY") && !log.contains("siwa-events-doctor-"), "the key or the probe token leaked: \(log)")
        }
        withExtendedLifetime(nothing) {}
        standIn.process.signal(SIGTERM)
        #expect(await standIn.process.waitForExit() == 0, "\(standIn.output.text)")
    }

    @Test("serve refuses to start on incomplete or unusable credentials, naming the variable (exit 78)", arguments: [
        (["SIWA_APPLE_TEAM_ID": "TEAMID1234"], "SIWA_APPLE_KEY_ID (--apple-key-id), SIWA_APPLE_PRIVATE_KEY_FILE (--apple-private-key-file): are required with SIWA_APPLE_TEAM_ID"),
        (["SIWA_APPLE_TEAM_ID": "teamid", "SIWA_APPLE_KEY_ID": "KEYID12345", "SIWA_APPLE_PRIVATE_KEY_FILE": "/nonexistent/AuthKey.p8"],
         "SIWA_APPLE_TEAM_ID (--apple-team-id): the team ID must be 10 characters, A-Z and 0-9"),
        (["SIWA_APPLE_TEAM_ID": "TEAMID1234", "SIWA_APPLE_KEY_ID": "KEYID12345", "SIWA_APPLE_PRIVATE_KEY_FILE": "/nonexistent/AuthKey.p8"],
         "SIWA_APPLE_PRIVATE_KEY_FILE (--apple-private-key-file): cannot read the Apple private key file /nonexistent/AuthKey.p8: no such file"),
        (["SIWA_APPLE_AUTH_URL": "http://appleid.example.com"], "SIWA_APPLE_AUTH_URL (--apple-auth-url): is plain http:// to a non-loopback host"),
        (["SIWA_APPLE_TEAM_ID": "TEAMID1234", "SIWA_APPLE_KEY_ID": "KEYID12345", "SIWA_APPLE_PRIVATE_KEY_FILE": "/nonexistent/AuthKey.p8"]
            .merging(["SIWA_APPLE_TOKEN_KEYS": "\(AppleTokenCipher.generateKey()) c2hvcnQ="]) { $1 },
         "SIWA_APPLE_TOKEN_KEYS (--apple-token-keys): key 2 decodes to 5 bytes: each key is the base64 of exactly 32 random bytes"),
        (["SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey()],
         "SIWA_APPLE_TOKEN_KEYS (--apple-token-keys): is set, but SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and SIWA_APPLE_PRIVATE_KEY_FILE are not"),
    ])
    func serveRefusesBadCredentials(environment: [String: String], message: String) async throws {
        let directory = try TestBinary.makeDirectory("apple-credentials-bad")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let served = try await TestBinary.run(
            ["serve"], environment: environment.merging(["SIWA_APPLE_BUNDLE_IDS": "com.example.app", "DATABASE_URL": "", "SIWA_EMBEDDED_DATABASE": "off"]) { $1 }, directory: directory)
        #expect(served.status == 78, "status \(served.status): \(served.stderr)")
        #expect(served.stderr.contains(message), "\(served.stderr)")
    }
}
