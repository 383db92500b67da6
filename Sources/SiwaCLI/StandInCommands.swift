import ArgumentParser
import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import SiwaApp
import SiwaAppleStandIn
import SiwaDomain
import SiwaRuntime
import UnixSignals

/// `standin`: Apple's auth endpoints on this machine, beside the key-set stand-in of `keys`/`send`.
struct StandInCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "standin", abstract: "A local stand-in for Apple's auth endpoints (/auth/token, /auth/revoke, /auth/usermigrationinfo).",
        subcommands: [Serve.self, Code.self, Revocations.self])

    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Serve /auth/token and /auth/revoke as Apple does, with codes from `standin code`.",
            discussion: """
                id_tokens are signed with the key of `keys generate` in --keys, so a server started with
                SIWA_APPLE_JWKS_URL=file://DIR/jwks.json verifies them. Each --key-id's team key is read from
                DIR/AuthKey_<KEY-ID>.p8, or made there (P-256, as Apple's .p8) when missing: client secrets
                must be signed with it. Every revocation request is kept: GET /standin/revocations.

                App transfer (/auth/usermigrationinfo): --recipient-team-id adds the team an app moves to,
                owning the same --client-ids, with its own --recipient-key-id keys. transfer_subs are
                derived from the key in --keys: the same directory gives the same ones. Mark users with
                POST /standin/users {"sub": "...", "is_private_email": true, "revoked": false}.

                Examples:
                  siwa-events keys generate --dir siwa-keys
                  siwa-events standin serve --keys siwa-keys --port 8090 \\
                    --team-id TEAMID1234 --key-id KEYID12345 --client-ids com.example.app
                  siwa-events standin serve --keys siwa-keys --port 8090 \\
                    --team-id TEAMID1234 --key-id KEYID12345 --client-ids com.example.app \\
                    --recipient-team-id TEAMB23456 --recipient-key-id KEYB234567 \\
                    --migration-rate 10 --latency 50ms
                """)
        @Option(help: "Directory written by `keys generate` (the team's .p8 keys are kept there too).") var keys: String
        @Option(help: "Address to listen on: a loopback one unless --allow-remote.") var host = "127.0.0.1"
        @Flag(
            name: .customLong("allow-remote"),
            help: "Listen on a --host other machines reach (Apple's routes only: /standin routes answer only Host localhost, 127.0.0.1 or [::1]).")
        var allowRemote = false
        @Option(help: "Port to listen on (0: any free port, printed).") var port = 8090
        @Option(name: .customLong("team-id"), help: "Your Apple team ID: client secrets' iss.") var teamID: String
        @Option(name: .customLong("key-id"), help: "A Sign in with Apple key ID of the team (repeat for two keys, as in a rotation).")
        var keyIDs: [String] = []
        @Option(name: .customLong("client-ids"), help: "Comma-separated client IDs of the team: bundle IDs and Services IDs.")
        var clientIDs: String
        @Option(name: .customLong("recipient-team-id"), help: "A second team, the recipient of an app transfer: it owns the same --client-ids.")
        var recipientTeamID: String?
        @Option(name: .customLong("recipient-key-id"), help: "A Sign in with Apple key ID of the recipient team (repeatable).")
        var recipientKeyIDs: [String] = []
        @Option(name: .customLong("migration-rate"), help: "Requests per second /auth/usermigrationinfo takes before answering 429 (0: no limit).")
        var migrationRate: Double = 0
        @Option(help: "Wait this long before each answer, e.g. 50ms: Apple's round trip, for benchmarks (default none).")
        var latency: String = "0s"

        func validate() throws {
            if host.isEmpty { throw ValidationError("--host must be an address such as 127.0.0.1") }
            if !LoopbackHost.contains(host) && !allowRemote {
                throw ValidationError(
                    "--host \(host) is not a loopback address: other machines would reach the stand-in, which issues tokens with no real sign-in;"
                        + " keep the default 127.0.0.1, or add --allow-remote if that is meant")
            }
            if !(0...65535).contains(port) { throw ValidationError("--port must be between 0 and 65535 (0: any free port), not \(port)") }
            if !Self.isAppleID(teamID) {
                throw ValidationError("--team-id must be a team ID as Apple shows it: up to 10 characters A-Z and 0-9 (got \"\(teamID)\")")
            }
            if keyIDs.isEmpty { throw ValidationError("--key-id is required: the key ID of the team's Sign in with Apple key, e.g. KEYID12345") }
            for keyID in keyIDs where !Self.isAppleID(keyID) {
                throw ValidationError("--key-id must be a key ID as Apple shows it: up to 10 characters A-Z and 0-9 (got \"\(keyID)\")")
            }
            if Set(keyIDs).count != keyIDs.count { throw ValidationError("--key-id: each key once (got \(keyIDs.joined(separator: ", ")))") }
            if let recipientTeamID {
                if !ClientSecretPolicy.isAppleIdentifier(recipientTeamID) || recipientTeamID == teamID {
                    throw ValidationError("--recipient-team-id must be another team's ID: 10 characters A-Z and 0-9 (got \"\(recipientTeamID)\")")
                }
                if recipientKeyIDs.isEmpty { throw ValidationError("--recipient-team-id needs --recipient-key-id: the recipient team's key ID, e.g. KEYB234567") }
            } else if !recipientKeyIDs.isEmpty {
                throw ValidationError("--recipient-key-id needs --recipient-team-id (the team the key belongs to)")
            }
            for keyID in recipientKeyIDs where !Self.isAppleID(keyID) {
                throw ValidationError("--recipient-key-id must be a key ID as Apple shows it: up to 10 characters A-Z and 0-9 (got \"\(keyID)\")")
            }
            if Set(keyIDs + recipientKeyIDs).count != keyIDs.count + recipientKeyIDs.count {
                throw ValidationError("--key-id and --recipient-key-id: each key once, in one team (got \((keyIDs + recipientKeyIDs).joined(separator: ", ")))")
            }
            guard let wait = try? DurationSyntax.parse(latency), wait <= .seconds(10) else {
                throw ValidationError("--latency must be a duration of at most 10s, like 50ms (got \"\(latency)\")")
            }
            if !migrationRate.isFinite || migrationRate < 0 {
                throw ValidationError("--migration-rate must be requests per second, 0 or more (0: no limit), not \(migrationRate)")
            }
            let clients = Self.list(clientIDs)
            if clients.isEmpty || clients.contains(where: { $0.isEmpty || $0.contains(where: \.isWhitespace) }) {
                throw ValidationError("--client-ids must be comma-separated client IDs without spaces, e.g. com.example.app,com.example.web (got \"\(clientIDs)\")")
            }
        }

        static func isAppleID(_ text: String) -> Bool {
            (1...10).contains(text.count) && text.allSatisfy { ("A"..."Z").contains($0) || ("0"..."9").contains($0) }
        }

        static func list(_ text: String) -> [String] {
            text.split(separator: ",", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        }

        func run() async throws {
            let signer = try localSigner(keys)
            let directory = URL(fileURLWithPath: keys).standardizedFileURL
            var keyLines: [String] = []
            func teamKeys(_ ids: [String], label: String) throws -> [String: P256.Signing.PublicKey] {
                var keys: [String: P256.Signing.PublicKey] = [:]
                for keyID in ids {
                    let (key, file, made) = try Self.teamKey(keyID, in: directory)
                    keys[keyID] = key.publicKey
                    keyLines.append("\(label) \(keyID): \(file) (\(made ? "made now" : "read"))")
                }
                return keys
            }
            let clients = Set(Self.list(clientIDs))
            var teams = [StandInTeam(teamID: teamID, keys: try teamKeys(keyIDs, label: "team key"), clientIDs: clients)]
            if let recipientTeamID {
                teams.append(StandInTeam(teamID: recipientTeamID, keys: try teamKeys(recipientKeyIDs, label: "recipient team \(recipientTeamID) key"), clientIDs: clients))
            }
            LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: .info) }
            let logger = Logger(label: "siwa-events-standin")
            var configuration = AppleAuthStandIn.Configuration(teams: teams, signer: signer)
            (configuration.host, configuration.port) = (host, port)
            configuration.limits.migrationPerSecond = migrationRate
            configuration.latency = try DurationSyntax.parse(latency)
            let standIn = AppleAuthStandIn(configuration, logger: logger)
            let group = ServiceGroup(
                configuration: .init(services: [standIn], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
            do {
                try await withThrowingTaskGroup(of: Void.self) { tasks in
                    tasks.addTask { try await group.run() }
                    let url = try await standIn.url
                    // A wildcard address is reached here at 127.0.0.1, the Host /standin routes answer.
                    let local = ["0.0.0.0", "::", "[::]"].contains(host) ? URL(string: "http://127.0.0.1:\(url.port ?? port)")! : url
                    let lines = ["standin listening on \(url.absoluteString)"] + keyLines + [
                        "client IDs: \(Self.list(clientIDs).joined(separator: ", "))",
                        "usermigrationinfo: \(migrationRate > 0 ? "at most \(migrationRate) requests/s" : "no rate limit")"
                            + (recipientTeamID.map { ", recipient team \($0)" } ?? ", no recipient team (--recipient-team-id)"),
                        "id_tokens verify with: SIWA_APPLE_JWKS_URL=\(directory.appendingPathComponent("jwks.json").absoluteString)",
                        "a code: siwa-events standin code --url \(local.absoluteString) --client-id \(Self.list(clientIDs)[0]) --sub 001234.abcdef.0001",
                    ]
                    FileHandle.standardOutput.write(Data((lines.joined(separator: "\n") + "\n").utf8))  // unbuffered: a pipe's reader sees it now
                    try await tasks.waitForAll()
                }
            } catch {
                printError("siwa-events standin serve: cannot serve on \(host):\(port) (\(error)): choose another --port or --host")
                throw ExitCode(78)
            }
        }

        /// The team's key `keyID`: read from DIR/AuthKey_<keyID>.p8 (Apple's file name), or made there.
        static func teamKey(_ keyID: String, in directory: URL) throws -> (key: P256.Signing.PrivateKey, file: String, made: Bool) {
            let file = directory.appendingPathComponent("AuthKey_\(keyID).p8").path
            if FileManager.default.fileExists(atPath: file) {
                guard let pem = try? String(contentsOfFile: file, encoding: .utf8), let key = try? P256.Signing.PrivateKey(pemRepresentation: pem) else {
                    throw ValidationError("--key-id \(keyID): \(file) is not a P-256 private key (a .p8); remove it to have a new one made")
                }
                return (key, file, false)
            }
            let key = P256.Signing.PrivateKey()
            do {
                try PrivateFile.write(Data(key.pemRepresentation.utf8), to: file)
            } catch {
                printError("siwa-events: --keys \(directory.path): \(error)")
                throw ExitCode(1)
            }
            return (key, file, true)
        }
    }

    struct Code: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print an authorization code from a running `standin serve`, as Apple gives an app at sign-in.",
            discussion: """
                The code is for one exchange at /auth/token within 5 minutes.

                Examples:
                  siwa-events standin code --url http://127.0.0.1:8090 \\
                    --client-id com.example.app --sub 001234.abcdef.0001
                  siwa-events standin code --url http://127.0.0.1:8090 \\
                    --client-id com.example.web --sub 001.a.1 \\
                    --email x7k2q@privaterelay.appleid.com --private \\
                    --redirect-uri https://example.com/apple/callback
                """)
        @Option(help: "The stand-in's base URL, as `standin serve` printed it.") var url: String
        @Option(name: .customLong("client-id"), help: "The client ID the user signs in to (one of the stand-in's --client-ids).") var clientID: String
        @Option(help: "The user (Apple's team-scoped sub).") var sub: String
        @Option(help: "The user's address (a relay address for a hidden email).") var email: String?
        @Flag(help: "Mark the address as a private relay address.") var `private` = false
        @Option(name: .customLong("redirect-uri"), help: "A web sign-in's redirect URI: the exchange must send the same.") var redirectURI: String?
        @Option(help: "The raw nonce the app generated: the id_token carries its SHA-256 hex, as Apple's do.") var nonce: String?

        func validate() throws {
            if standInURL(url) == nil { throw ValidationError("--url must be the stand-in's base URL, like http://127.0.0.1:8090 (got \"\(url)\")") }
            if clientID.isEmpty { throw ValidationError("--client-id must be a client ID like com.example.app") }
            if sub.isEmpty { throw ValidationError("--sub must not be empty (Apple's user id, e.g. 001234.abcdef.0001)") }
            if `private` && email == nil { throw ValidationError("--private needs --email (the relay address)") }
            if email?.isEmpty == true { throw ValidationError("--email must not be empty (leave it out for a user without one)") }
            if redirectURI?.isEmpty == true { throw ValidationError("--redirect-uri must not be empty (leave it out for a native sign-in)") }
            if nonce?.isEmpty == true { throw ValidationError("--nonce must not be empty (leave it out for a code without a nonce)") }
        }

        func run() async throws {
            var request: [String: JSONValue] = ["client_id": .string(clientID), "sub": .string(sub)]
            if let email { request["email"] = .string(email); request["is_private_email"] = .bool(`private`) }
            if let redirectURI { request["redirect_uri"] = .string(redirectURI) }
            if let nonce { request["nonce"] = .string(IdentityTokenVerifier.nonceHash(nonce)) }
            let (status, body) = try await standInRequest(.POST, url, "standin/codes", json: .object(request))
            guard status == 200, let code = body["code"]?.stringValue else {
                printError("siwa-events standin code: \(body["message"]?.stringValue ?? "the stand-in answered \(status)")")
                throw ExitCode(1)
            }
            print(code)
        }
    }

    struct Revocations: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print what a running `standin serve` was sent at /auth/revoke (JSON, oldest first).",
            discussion: """
                /auth/revoke answers 200 for any token, as Apple's does: this shows what was sent and what it did.

                Examples:
                  siwa-events standin revocations --url http://127.0.0.1:8090
                """)
        @Option(help: "The stand-in's base URL, as `standin serve` printed it.") var url: String

        func validate() throws {
            if standInURL(url) == nil { throw ValidationError("--url must be the stand-in's base URL, like http://127.0.0.1:8090 (got \"\(url)\")") }
        }

        func run() async throws {
            let (status, body) = try await standInRequest(.GET, url, "standin/revocations", json: nil)
            guard status == 200 else {
                printError("siwa-events standin revocations: the stand-in answered \(status)")
                throw ExitCode(1)
            }
            print(body.jsonText)
        }
    }
}

/// `--url` as an http(s) base URL, or nil.
private func standInURL(_ text: String) -> URL? {
    guard let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), url.host != nil else { return nil }
    return url
}

/// One request to a running stand-in: its status and JSON body. Exit 2 when it cannot be reached.
private func standInRequest(_ method: HTTPMethod, _ base: String, _ path: String, json: JSONValue?) async throws -> (Int, JSONValue) {
    let url = standInURL(base)!.appendingPathComponent(path).absoluteString
    var request = HTTPClientRequest(url: url)
    request.method = method
    if let json {
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: json.jsonText))
    }
    do {
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let body = try await response.body.collect(upTo: 8 << 20)
        return (Int(response.status.code), JSONValue.parse(body.readableBytesView) ?? .null)
    } catch {
        printError("\(method.rawValue) \(url) failed (is `siwa-events standin serve` running there?): \(error)")
        throw ExitCode(2)
    }
}
