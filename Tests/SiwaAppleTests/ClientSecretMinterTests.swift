import Crypto
import Foundation
import JWTKit
import SiwaApple
import SiwaDomain
import Testing

/// A `.p8`-shaped key file in a fresh directory, removed with it.
struct KeyFile {
    let directory: URL
    let path: String
    let privateKey: P256.Signing.PrivateKey

    init(contents: String? = nil) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-p8-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        path = directory.appendingPathComponent("AuthKey_KEY1234567.p8").path
        privateKey = P256.Signing.PrivateKey()
        try (contents ?? privateKey.pemRepresentation).write(toFile: path, atomically: true, encoding: .utf8)
    }

    func remove() { try? FileManager.default.removeItem(at: directory) }
}

@Suite("Client secrets: ES256 JWTs minted from the team's .p8, cached and renewed", .timeLimit(.minutes(10)))
struct ClientSecretMinterTests {
    let start = Date(timeIntervalSince1970: 1_790_000_000)

    func minter(_ file: KeyFile) throws -> ClientSecretMinter {
        ClientSecretMinter(
            policy: try ClientSecretPolicy(teamID: "TEAM123456", lifetime: .seconds(3600), backdate: .seconds(60), renewalMargin: .seconds(300)),
            key: try .load(path: file.path, keyID: "KEY1234567"))
    }

    @Test("a minted secret is header {alg ES256, kid}, Apple's claims, and a raw r‖s signature the public key verifies")
    func minted() throws {
        let file = try KeyFile()
        defer { file.remove() }
        let secret = try minter(file).secret(clientID: "com.example.app", now: start)
        let parts = secret.jwt.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        try #require(parts.count == 3)
        #expect(JSONValue.parse(try #require(Base64URL.decode(parts[0]))) == ["alg": "ES256", "kid": "KEY1234567"])
        #expect(JSONValue.parse(try #require(Base64URL.decode(parts[1]))) == [
            "iss": "TEAM123456", "sub": "com.example.app", "aud": "https://appleid.apple.com",
            "iat": .number(1_789_999_940), "exp": .number(1_790_003_540),
        ])
        let signature = try #require(Base64URL.decode(parts[2]))
        #expect(signature.count == 64, "raw r ‖ s, not DER")
        let verified = file.privateKey.publicKey.isValidSignature(
            try P256.Signing.ECDSASignature(rawRepresentation: signature), for: Data((parts[0] + "." + parts[1]).utf8))
        #expect(verified)
        let otherKey = P256.Signing.PrivateKey().publicKey
        #expect(!otherKey.isValidSignature(try P256.Signing.ECDSASignature(rawRepresentation: signature), for: Data((parts[0] + "." + parts[1]).utf8)))
        #expect(!"\(secret)".contains(secret.jwt) && !String(reflecting: secret).contains(parts[2]))
    }

    struct ClientSecretPayload: JWTPayload {
        var iss: String
        var sub: String
        var aud: String
        var iat: Int
        var exp: Int
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    @Test("jwt-kit, an independent ES256 implementation, verifies the secret with the public key")
    func jwtKitVerifies() async throws {
        let file = try KeyFile()
        defer { file.remove() }
        let secret = try minter(file).secret(clientID: "com.example.web", now: start)
        let keys = await JWTKeyCollection().add(ecdsa: try ES256PublicKey(pem: file.privateKey.publicKey.pemRepresentation), kid: "KEY1234567")
        let payload = try await keys.verify(secret.jwt, as: ClientSecretPayload.self)
        #expect(payload.sub == "com.example.web" && payload.iss == "TEAM123456" && payload.exp - payload.iat == 3600)
        let stranger = await JWTKeyCollection().add(ecdsa: try ES256PublicKey(pem: P256.Signing.PrivateKey().publicKey.pemRepresentation), kid: "KEY1234567")
        await #expect(throws: (any Error).self) { try await stranger.verify(secret.jwt, as: ClientSecretPayload.self) }
    }

    @Test("a secret is reused per client ID until the renewal margin, then a new one is minted")
    func cachedAndRenewed() throws {
        let file = try KeyFile()
        defer { file.remove() }
        let minter = try minter(file)
        let first = try minter.secret(clientID: "com.example.app", now: start)
        // exp is start - 60 + 3600; the margin is 300 s: renewed from start + 3240 on.
        let lastReuse = start.addingTimeInterval(3239)
        #expect(try minter.secret(clientID: "com.example.app", now: start.addingTimeInterval(1)).jwt == first.jwt)
        #expect(try minter.secret(clientID: "com.example.app", now: lastReuse).jwt == first.jwt)
        let other = try minter.secret(clientID: "com.example.web", now: start.addingTimeInterval(1))
        #expect(other.jwt != first.jwt && other.claims.subject == "com.example.web")
        let renewed = try minter.secret(clientID: "com.example.app", now: start.addingTimeInterval(3240))
        #expect(renewed.jwt != first.jwt)
        #expect(renewed.claims.issuedAt == first.claims.issuedAt + 3240)
        #expect(try minter.secret(clientID: "com.example.app", now: start.addingTimeInterval(3241)).jwt == renewed.jwt)
        // The web client's secret was minted a second later and still has that second to go.
        #expect(try minter.secret(clientID: "com.example.web", now: start.addingTimeInterval(3240)).jwt == other.jwt)
    }

    @Test("the key is read once: a key file that disappears later does not stop minting")
    func readOnce() throws {
        let file = try KeyFile()
        let minter = try minter(file)
        file.remove()
        #expect(!FileManager.default.fileExists(atPath: file.path))
        #expect(try minter.secret(clientID: "com.example.app", now: start).claims.subject == "com.example.app")
    }

    @Test("a missing file, a directory, junk and a key that is not P-256 are typed errors naming the path, never the content")
    func badKeyFiles() throws {
        let missing = "/nonexistent/siwa/AuthKey_KEY1234567.p8"
        #expect(throws: ClientSecretMinter.SigningKey.LoadError.unreadable(path: missing, reason: "no such file")) {
            try ClientSecretMinter.SigningKey.load(path: missing, keyID: "KEY1234567")
        }
        let junk = try KeyFile(contents: "not a key at all: hunter2-secret-content")
        let p384 = try KeyFile(contents: P384.Signing.PrivateKey().pemRepresentation)
        let truncated = try KeyFile(contents: String(P256.Signing.PrivateKey().pemRepresentation.dropLast(40)))
        defer { [junk, p384, truncated].forEach { $0.remove() } }
        for file in [junk, p384, truncated] {
            let content = try String(contentsOfFile: file.path, encoding: .utf8)
            #expect {
                try ClientSecretMinter.SigningKey.load(path: file.path, keyID: "KEY1234567")
            } throws: { error in
                let shown = "\(error)" + String(reflecting: error)
                let secretLines = content.split(separator: "\n").filter { !$0.hasPrefix("-----") }
                return error as? ClientSecretMinter.SigningKey.LoadError == .notAP256Key(path: file.path) && shown.contains(file.path)
                    && secretLines.allSatisfy { !shown.contains($0) }
            }
        }
        #expect(throws: ClientSecretMinter.SigningKey.LoadError.unreadable(path: junk.directory.path, reason: "not a readable file")) {
            try ClientSecretMinter.SigningKey.load(path: junk.directory.path, keyID: "KEY1234567")
        }
        let good = try KeyFile()
        defer { good.remove() }
        #expect(throws: ClientSecretMinter.SigningKey.LoadError.invalidKeyID("key-1")) {
            try ClientSecretMinter.SigningKey.load(path: good.path, keyID: "key-1")
        }
    }
}
