import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaApp
import SiwaApple
import SiwaDomain

/// `verify`: offline verification with the very verifier the server uses.
struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Verify a notification offline with the server's verifier.",
        discussion: """
            Prints {"valid","reason","message","header","claims","event"}. Exit 0 when valid, 1 when not \
            (same reason words as the endpoint), 2 when it could not check (unreadable file, JWKS unreachable).

            Examples:
              siwa-events verify @body.json --jwks https://appleid.apple.com/auth/keys
              siwa-events verify @body.json --jwks keys/jwks.json --at 1763712000
            """)

    @Argument(help: "A compact JWS, or @file holding a JWS or a JSON object with a payload (Apple's POST body) or jws field.")
    var token: String
    @Option(help: "Key set: a file path or an https:// / file:// URL (e.g. https://appleid.apple.com/auth/keys).")
    var jwks: String
    @Option(help: "Accepted bundle ID(s), comma-separated. Default: SIWA_APPLE_BUNDLE_IDS, else the token's own aud (not checked).")
    var aud: String?
    @Option(help: "Verify as of this time: ISO-8601 or epoch seconds. Default: now.")
    var at: String?

    enum ExitStatus { static let invalid: Int32 = 1, couldNotCheck: Int32 = 2 }

    func run() async throws {
        let now = try verificationTime()
        let text = try readTokenOrExit()
        let keys = try await loadKeySet()
        let jws = try? CompactJWS(text)
        let claims = jws.flatMap { JSONValue.parse($0.payload) }
        let (audiences, audChecked) = try self.audiences(claims: claims)
        var result: [String: JSONValue] = [
            "header": jws?.header ?? .null, "claims": claims ?? .null, "event": .null, "aud_checked": .bool(audChecked),
        ]
        do {
            let verified = try NotificationVerifier(audiences: audiences).verify(text, keys: keys, now: now)
            result["valid"] = .bool(true)
            result["reason"] = .null
            result["jti"] = .string(verified.jti)
            switch verified.decoding {
            case .event(let event):
                result["event"] = event.json
                result["status"] = .string("pending")
            case .skipped(let reason, let detail, let event):
                result["event"] = event?.json ?? .null
                result["status"] = .string("skipped")
                result["skip_reason"] = .string(reason.rawValue)
                result["message"] = .string(detail)
            }
            print(JSONValue.object(result).jsonText)
        } catch {
            result["valid"] = .bool(false)
            result["reason"] = .string(error.reason.rawValue)
            result["message"] = .string(error.message)
            print(JSONValue.object(result).jsonText)
            throw ExitCode(ExitStatus.invalid)
        }
    }

    /// `--at`, or now.
    func verificationTime() throws -> Date {
        guard let at else { return Date() }
        guard let parsed = Self.parseTime(at) else {
            printError("--at: \"\(at)\" is neither ISO-8601 (2022-12-02T21:15:31Z) nor epoch seconds")
            throw ExitCode(ExitStatus.couldNotCheck)
        }
        return parsed
    }

    /// The JWS the argument names (itself, or @file).
    func readTokenOrExit() throws -> String {
        do {
            return try Self.readToken(token)
        } catch let error as ValidationError {
            printError("cannot read the token: \(error.message)")
            throw ExitCode(ExitStatus.couldNotCheck)
        } catch {
            printError("cannot read the token from \(token): \((error as NSError).localizedDescription)")
            throw ExitCode(ExitStatus.couldNotCheck)
        }
    }

    /// `--jwks`: a file path or a URL.
    func loadKeySet() async throws -> AppleKeySet {
        do {
            let url = jwks.contains("://") ? URL(string: jwks) : URL(fileURLWithPath: jwks)
            guard let url else { throw DefaultKeySetFetcher.FetchError(description: "--jwks: \"\(jwks)\" is not a path or URL") }
            return try AppleKeySet.parse(try await DefaultKeySetFetcher().fetch(url))
        } catch {
            printError("cannot load the key set: \(error)")
            throw ExitCode(ExitStatus.couldNotCheck)
        }
    }

    /// The audiences accepted: `--aud`, else SIWA_APPLE_BUNDLE_IDS (checked); else the token's own
    /// `aud` (not checked).
    func audiences(claims: JSONValue?) throws -> (Set<String>, checked: Bool) {
        let configured = try aud ?? CommandLineSettings.source(arguments: [], groups: SettingGroup.allCases).text(Settings.bundleIDs.info)
        let listed = Set((configured ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
        guard listed.isEmpty else { return (listed, true) }
        switch claims?["aud"] {
        case .string(let value)?: return ([value], false)
        case .array(let values)?: return (Set(values.compactMap(\.stringValue)), false)
        default: return ([], false)
        }
    }

    static func parseTime(_ text: String) -> Date? {
        if let seconds = Double(text) { return Date(timeIntervalSince1970: seconds) }
        if let date = try? Date(text, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true)) { return date }
        return try? Date(text, strategy: Date.ISO8601FormatStyle())
    }

    /// A JWS, or `@file` with a raw JWS or a JSON object carrying `payload` or `jws`.
    static func readToken(_ argument: String) throws -> String {
        guard argument.hasPrefix("@") else { return argument.trimmingCharacters(in: .whitespacesAndNewlines) }
        let content = try String(contentsOfFile: String(argument.dropFirst()), encoding: .utf8)
        if let json = JSONValue.parse(Data(content.utf8)), json.objectValue != nil {
            if let payload = json["payload"]?.stringValue { return payload }
            if let jws = json["jws"]?.stringValue { return jws }
            throw ValidationError("\(argument.dropFirst()) is a JSON object without a payload or jws field")
        }
        return content.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

struct KeysCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys", abstract: "Local signing keys for trying the server without Apple.", subcommands: [Generate.self, IDToken.self])

    struct Generate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a new RSA-2048 key: DIR/private-key.pem and DIR/jwks.json.",
            discussion: """
                A local stand-in for Apple's key, for `send` and `keys id-token`; a server trusts it only
                when started with SIWA_APPLE_JWKS_URL=file://DIR/jwks.json.

                Examples:
                  siwa-events keys generate --dir siwa-keys
                """)
        @Option(help: "Directory to write the key into (created if missing).") var dir: String

        func run() async throws {
            let directory = URL(fileURLWithPath: dir).standardizedFileURL
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let signer = try AppleStyleSigner.generate()
            let keyFile = directory.appendingPathComponent("private-key.pem")
            let jwksFile = directory.appendingPathComponent("jwks.json")
            do {
                try PrivateFile.write(Data(signer.privateKeyPEM.utf8), to: keyFile.path)
                try PrivateFile.write(try signer.jwksDocument(), to: jwksFile.path, mode: 0o644)  // public keys
            } catch {
                printError("siwa-events: --dir \(dir): \(error)")
                throw ExitCode(1)
            }
            print("kid \(signer.kid)")
            print("private key: \(keyFile.path)")
            print("key set:     \(jwksFile.path)")
            print("serve with:  SIWA_APPLE_JWKS_URL=\(jwksFile.absoluteString)")
        }
    }

    /// A test identity token, as Apple hands one to an app at sign-in, for `POST /v1/sessions`
    /// and the integration guide's recipes without an Apple device.
    struct IDToken: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "id-token",
            abstract: "Print a test Sign in with Apple identity token signed with a key from `keys generate`.",
            discussion: """
                Trusted only by a server started with SIWA_APPLE_JWKS_URL=file://DIR/jwks.json.

                Examples:
                  siwa-events keys id-token --keys siwa-keys --aud com.example.app \\
                    --sub 001.a.1
                  siwa-events keys id-token --keys siwa-keys --aud com.example.app \\
                    --sub 001.a.1 --email x7k2q@privaterelay.appleid.com --private \\
                    --nonce "$NONCE"
                  siwa-events keys id-token --keys siwa-keys --aud com.example.app \\
                    --sub 001234.0a1b2c.0001 --transfer-sub st1.abc
                """)
        @Option(help: "Directory written by `keys generate`.") var keys: String
        @Option(help: "Client ID to put in aud: a bundle ID, or a Services ID for a web sign-in.") var aud: String
        @Option(help: "The user (Apple's team-scoped sub).") var sub: String
        @Option(help: "The user's address (a relay address for a hidden email).") var email: String?
        @Flag(help: "Mark the address as a private relay address.") var `private` = false
        @Option(help: "The raw nonce the app generated: the token carries its SHA-256 hex, as Apple's do.") var nonce: String?
        @Option(name: .customLong("transfer-sub"), help: "A migrated user's transfer_sub claim, as Apple adds it for 60 days after an app transfer.")
        var transferSub: String?

        func validate() throws {
            if let transferSub, transferSub.isEmpty || transferSub.utf8.count > AppleTransferSub.maximumLength {
                throw ValidationError("--transfer-sub must be 1 to \(AppleTransferSub.maximumLength) bytes (the sending team's transfer_sub)")
            }
            if aud.isEmpty { throw ValidationError("--aud must be a client ID like com.example.app") }
            if sub.isEmpty { throw ValidationError("--sub must not be empty (Apple's user id, e.g. 001234.abcdef.0001)") }
            if `private` && email == nil { throw ValidationError("--private needs --email (the relay address)") }
            if nonce?.isEmpty == true { throw ValidationError("--nonce must not be empty (leave it out for a token without a nonce)") }
        }

        func run() throws {
            print(try localSigner(keys).identityToken(
                aud: aud, sub: sub, email: email, isPrivateEmail: email == nil ? nil : `private`,
                nonce: nonce.map(IdentityTokenVerifier.nonceHash), transferSub: transferSub))
        }
    }
}

/// The signer of `keys generate`'s key in `directory` (`--keys`).
func localSigner(_ directory: String) throws -> AppleStyleSigner {
    let pem: String
    do {
        pem = try String(contentsOfFile: URL(fileURLWithPath: directory).appendingPathComponent("private-key.pem").path, encoding: .utf8)
    } catch {
        throw ValidationError("--keys: cannot read \(directory)/private-key.pem (run `siwa-events keys generate --dir \(directory)` first)")
    }
    do {
        return try AppleStyleSigner(pem: pem)
    } catch {
        throw ValidationError("--keys: \(directory)/private-key.pem is not an RSA private key from `siwa-events keys generate`")
    }
}

/// `send`: a local stand-in for Apple that signs and POSTs a notification.
struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sign a notification exactly as Apple does and POST it to a running server.",
        discussion: """
            Examples:
              siwa-events send consent-revoked --sub 001.a.1 --keys siwa-keys \\
                --aud com.example.app --url http://127.0.0.1:8080
              siwa-events send email-disabled --sub 001.a.1 --keys siwa-keys \\
                --aud com.example.app --url http://127.0.0.1:8080 \\
                --email x7k2q@privaterelay.appleid.com --private
            """)

    @Argument(help: "email-disabled, email-enabled, consent-revoked, account-delete (any string is sent as is).")
    var type: String
    @Option(help: "The user (Apple's team-scoped sub).") var sub: String
    @Option(help: "Relay or real address, for email events.") var email: String?
    @Flag(help: "Mark the address as a private relay address.") var `private` = false
    @Option(help: "Directory written by `keys generate`.") var keys: String
    @Option(help: "Bundle ID to put in aud.") var aud: String
    @Option(help: "Server base URL, e.g. http://127.0.0.1:8080.") var url: String
    @Option(help: "jti to use (default: a new UUID; reuse one to see a duplicate).") var jti: String?

    func run() async throws {
        let signer = try localSigner(keys)
        let jws = try signer.notification(
            aud: aud, type: type, sub: sub, email: email, isPrivateEmail: email == nil ? nil : `private`, jti: jti ?? UUID().uuidString)
        guard let base = URL(string: url), base.scheme != nil else { throw ValidationError("--url must be a base URL like http://127.0.0.1:8080") }
        var request = HTTPClientRequest(url: base.appendingPathComponent("apple/notifications").absoluteString)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.body = .bytes(ByteBuffer(string: AppleStyleSigner.body(jws)))
        let response: HTTPClientResponse
        do {
            response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        } catch {
            printError("POST \(url)/apple/notifications failed: \(error)")
            throw ExitCode(2)
        }
        let body = try await response.body.collect(upTo: 1 << 20)
        print("\(response.status.code) \(String(buffer: body))")
        if !(200..<300).contains(Int(response.status.code)) { throw ExitCode(1) }
    }
}
