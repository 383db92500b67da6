import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import NIOHTTP1
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// `siwa-events standin`, the real binary as a user runs it: serve, a code, its exchange with a
/// secret signed by the .p8 that `serve` made, the revocation listed, SIGTERM.
@Suite("siwa-events standin", .timeLimit(.minutes(10)))
struct StandInCommandTests {
    @Test("standin serve makes the team's .p8 and serves; standin code's code exchanges for an id_token the local JWKS verifies")
    func serveAndCode() async throws {
        let directory = try TestBinary.makeDirectory("standin")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let standIn = try await StandInProcess.start(in: directory)
        let (server, output, base) = (standIn.process, standIn.output, standIn.base)
        defer { server.signal(SIGKILL) }
        let keyFile = StandInProcess.keyFile(in: directory)
        #expect(output.text.contains("team key KEYID12345: \(keyFile) (made now)"), "\(output.text)")
        let mode = try #require(FileManager.default.attributesOfItem(atPath: keyFile)[.posixPermissions] as? Int)
        #expect(mode == 0o600)

        let coded = try await TestBinary.run(
            ["standin", "code", "--url", base, "--client-id", "com.example.app", "--sub", "001.cli.1", "--email", "x7k2q@privaterelay.appleid.com", "--private",
             "--nonce", "raw-nonce"],
            directory: directory)
        #expect(coded.status == 0, "\(coded.stderr)")
        let code = coded.stdout.trimmingCharacters(in: .whitespacesAndNewlines)

        let secrets = TestClientSecrets(
            teamID: "TEAMID1234", keyID: "KEYID12345", key: try P256.Signing.PrivateKey(pemRepresentation: String(contentsOfFile: keyFile, encoding: .utf8)))
        let secret = try secrets.secret(clientID: "com.example.app", issuedAt: Date().addingTimeInterval(-60))
        let exchanged = try await Self.post(
            "\(base)/auth/token", "grant_type=authorization_code&client_id=com.example.app&client_secret=\(secret)&code=\(code)")
        #expect(exchanged.status == 200, "\(exchanged.body)")
        let json = try #require(JSONValue.parse(Data(exchanged.body.utf8)))
        let keys = try AppleKeySet.parse(Data(contentsOf: URL(fileURLWithPath: "\(directory)/keys/jwks.json")))
        let verified = try IdentityTokenVerifier(clientIDs: ["com.example.app"]).verify(
            try #require(json["id_token"]?.stringValue), keys: keys, nonce: "raw-nonce", now: Date())
        #expect(verified.sub == "001.cli.1" && verified.email == "x7k2q@privaterelay.appleid.com" && verified.isPrivateEmail == true)

        let refreshToken = try #require(json["refresh_token"]?.stringValue)
        let revoked = try await Self.post(
            "\(base)/auth/revoke", "client_id=com.example.app&client_secret=\(secret)&token=\(refreshToken)&token_type_hint=refresh_token")
        #expect(revoked.status == 200 && revoked.body.isEmpty)
        let listed = try await TestBinary.run(["standin", "revocations", "--url", base], directory: directory)
        let record = JSONValue.parse(Data(listed.stdout.utf8))?["revocations"]?.arrayValue?.first
        #expect(record?["token"]?.stringValue == refreshToken && record?["outcome"] == "revoked", "\(listed.stdout) \(listed.stderr)")

        let unknown = try await TestBinary.run(["standin", "code", "--url", base, "--client-id", "com.example.nope", "--sub", "1"], directory: directory)
        #expect(unknown.status == 1 && unknown.stderr.contains("client_id must be one of the stand-in's client IDs: com.example.app"), "\(unknown.stderr)")

        server.signal(SIGTERM)
        #expect(await server.waitForExit() == 0, "\(output.text)")
    }

    @Test("standin serve with a recipient team: the same --keys directory gives the same transfer_sub after a restart; keys id-token carries it")
    func transfer() async throws {
        let directory = try TestBinary.makeDirectory("standin-transfer")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let recipientArguments = ["--recipient-team-id", "TEAMB23456", "--recipient-key-id", "KEYB234567", "--migration-rate", "100"]
        func key(_ keyID: String) throws -> P256.Signing.PrivateKey {
            try P256.Signing.PrivateKey(pemRepresentation: String(contentsOfFile: "\(directory)/keys/AuthKey_\(keyID).p8", encoding: .utf8))
        }
        /// One migration call on a fresh stand-in process: the token, then `form` with its Bearer.
        func migrationCall(_ team: String, _ keyID: String, _ form: String) async throws -> (status: Int, body: String) {
            let standIn = try await StandInProcess.start(in: directory, arguments: recipientArguments)
            defer { standIn.process.signal(SIGKILL) }
            #expect(standIn.output.text.contains("recipient team TEAMB23456 key KEYB234567"), "\(standIn.output.text)")
            let secret = try TestClientSecrets(teamID: team, keyID: keyID, key: try key(keyID))
                .secret(clientID: "com.example.app", issuedAt: Date().addingTimeInterval(-60))
            let token = try await Self.post(
                "\(standIn.base)/auth/token", "grant_type=client_credentials&scope=user.migration&client_id=com.example.app&client_secret=\(secret)")
            let bearer = try #require(JSONValue.parse(Data(token.body.utf8))?["access_token"]?.stringValue, "\(token.status) \(token.body)")
            return try await Self.post("\(standIn.base)/auth/usermigrationinfo", "\(form)&client_id=com.example.app&client_secret=\(secret)", bearer: bearer)
        }
        let sent = try await migrationCall("TEAMID1234", "KEYID12345", "sub=001.cli.1&target=TEAMB23456")
        let transferSub = try #require(JSONValue.parse(Data(sent.body.utf8))?["transfer_sub"]?.stringValue, "\(sent.status) \(sent.body)")
        let again = try await migrationCall("TEAMID1234", "KEYID12345", "sub=001.cli.1&target=TEAMB23456")
        #expect(JSONValue.parse(Data(again.body.utf8))?["transfer_sub"]?.stringValue == transferSub, "\(again.body)")
        let received = try await migrationCall("TEAMB23456", "KEYB234567", "transfer_sub=\(transferSub)")
        #expect(received.status == 200 && JSONValue.parse(Data(received.body.utf8))?["sub"]?.stringValue?.count == 44, "\(received.body)")

        let minted = try await TestBinary.run(
            ["keys", "id-token", "--keys", "keys", "--aud", "com.example.app", "--sub", "001.new.1", "--transfer-sub", transferSub], directory: directory)
        #expect(minted.status == 0, "\(minted.stderr)")
        let keys = try AppleKeySet.parse(Data(contentsOf: URL(fileURLWithPath: "\(directory)/keys/jwks.json")))
        let identity = try IdentityTokenVerifier(clientIDs: ["com.example.app"]).verify(
            minted.stdout.trimmingCharacters(in: .whitespacesAndNewlines), keys: keys, nonce: nil, now: Date())
        #expect(identity.transferSub == transferSub)
    }

    @Test("Each bad standin flag is refused (exit 64) with a message naming the flag", arguments: [
        (["serve", "--keys", "keys", "--team-id", "team/../x", "--key-id", "KEYID12345", "--client-ids", "a"], "--team-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "../KEY", "--client-ids", "a"], "--key-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--client-ids", "a"], "--key-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a,,b"], "--client-ids"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--port", "70000"], "--port"),
        (["serve", "--keys", "nowhere", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a"], "--keys"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--recipient-team-id", "TEAMID1234",
          "--recipient-key-id", "KEYB234567"], "--recipient-team-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--recipient-team-id", "TEAMB23456"],
         "--recipient-key-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--recipient-key-id", "KEYB234567"],
         "--recipient-team-id"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--recipient-team-id", "TEAMB23456",
          "--recipient-key-id", "KEYID12345"], "--recipient-key-id"),
        // Not loopback: other machines would reach routes that mint codes; said on purpose only.
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--host", "0.0.0.0"], "--allow-remote"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--host", "::"], "--allow-remote"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--host", "192.168.1.10"], "--allow-remote"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--host", "127.0.0.1.nip.io"], "--allow-remote"),
        (["serve", "--keys", "keys", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "a", "--migration-rate", "-1"],
         "--migration-rate"),
        (["code", "--url", "127.0.0.1:8090", "--client-id", "a", "--sub", "1"], "--url"),
        (["code", "--url", "http://127.0.0.1:8090", "--client-id", "a", "--sub", "1", "--private"], "--private"),
        (["revocations", "--url", "ftp://x"], "--url"),
    ])
    func badFlags(_ arguments: [String], _ flag: String) async throws {
        let directory = try TestBinary.makeDirectory("standin-flags")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let run = try await TestBinary.run(["standin"] + arguments, directory: directory)
        #expect(run.status == 64 && run.stderr.contains(flag), "\(run.status) \(run.stderr)")
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/keys"), "nothing is written for a refused command")
    }

    @Test("standin serve --host 0.0.0.0 --allow-remote serves; its code line names 127.0.0.1, where `standin code` gets a code")
    func allowRemote() async throws {
        let directory = try TestBinary.makeDirectory("standin-remote")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let (process, output) = try ChildOutput.start(
            TestBinary.url.path,
            ["standin", "serve", "--keys", "keys", "--port", "0", "--team-id", "TEAMID1234", "--key-id", "KEYID12345", "--client-ids", "com.example.app",
             "--host", "0.0.0.0", "--allow-remote"],
            environment: ProcessInfo.processInfo.environment, workingDirectory: directory)
        defer { process.signal(SIGKILL) }
        #expect(await output.wait(forLineWith: ["a code: siwa-events standin code"], within: .seconds(60)), "\(output.text)")
        let line = try #require(output.text.split(separator: "\n").first { $0.hasPrefix("a code: ") }, "\(output.text)")
        let url = try #require(line.split(separator: " ").first { $0.hasPrefix("http://127.0.0.1:") }, "\(line)")
        let coded = try await TestBinary.run(["standin", "code", "--url", String(url), "--client-id", "com.example.app", "--sub", "001.remote.1"], directory: directory)
        #expect(coded.status == 0 && !coded.stdout.isEmpty, "\(coded.status) \(coded.stdout) \(coded.stderr)")
        process.signal(SIGTERM)
        #expect(await process.waitForExit() == 0, "\(output.text)")
    }

    private static func post(_ url: String, _ form: String, bearer: String? = nil) async throws -> (status: Int, body: String) {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        request.body = .bytes(ByteBuffer(string: form))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        return (Int(response.status.code), String(buffer: try await response.body.collect(upTo: 1 << 20)))
    }
}
