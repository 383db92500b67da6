import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaRuntime
import Synchronization
import Testing

/// The real `siwa-events` binary (built next to the test bundle by `swift build --build-tests`),
/// with what tests that run it need: ports, databases, signing keys, readiness.
package enum TestBinary {
    package static let url: URL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("siwa-events")

    package struct Run {
        package var status: Int32
        package var stdout: String
        package var stderr: String
    }

    /// Runs the binary to completion. Spawned with the embedded module's posix_spawn helper, not
    /// Foundation's Process: Process's pipes and termination socket are inherited by children
    /// that other tests spawn at the same moment (a postmaster lives until the run ends), so a
    /// reader could wait for an EOF that never comes.
    package static func run(_ arguments: [String], environment: [String: String] = [:], directory: String) async throws -> Run {
        let result = try await Subprocess.run(
            url.path, arguments, environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
            workingDirectory: directory)
        return Run(status: result.terminatedBySignal ? 128 + result.status : result.status, stdout: result.standardOutput, stderr: result.standardError)
    }

    /// A port nothing listens on right now, chosen by the kernel (bound to 0 and released) and
    /// never handed out twice in one run. Racy (another bind may take it before its user does):
    /// only for a program that must be told its port in advance and cannot report the one it
    /// bound (the reverse proxies' configuration files); `serve` binds 0 (`startServing`), and
    /// "nothing listens here" is a `RefusingPort`.
    package static func freePort() -> Int {
        while true {
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            precondition(descriptor >= 0, "socket: \(String(cString: strerror(errno)))")
            defer { close(descriptor) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let bound = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
            }
            precondition(bound, "bind: \(String(cString: strerror(errno)))")
            let port = Int(UInt16(bigEndian: address.sin_port))
            if handedOut.withLock({ $0.insert(port).inserted }) { return port }
        }
    }

    private static let handedOut = Mutex(Set<Int>())

    /// A loopback port bound and not listening, for as long as this lives: a connection to it is
    /// refused at once, and no one else can bind it meanwhile — "nothing listens here" without
    /// `freePort`'s race (a port released could be taken by another test's server).
    package final class RefusingPort: Sendable {
        package let port: Int
        private let descriptor: Int32

        package init() { (descriptor, port) = TestBinary.bindLoopback(listening: false) }
        deinit { close(descriptor) }
    }

    /// A loopback port held in the LISTEN state by a socket that never accepts: a connection to
    /// it completes (the kernel's backlog) and then never gets an answer; and no one else can bind it.
    package final class SilentListener: Sendable {
        package let port: Int
        private let descriptor: Int32

        package init() { (descriptor, port) = TestBinary.bindLoopback(listening: true) }
        deinit { close(descriptor) }

        /// Whether a client connects within `limit` (its connection waits in the backlog,
        /// unanswered): `poll` on the listening socket, on a thread of its own.
        package func waitForConnection(within limit: Duration = .seconds(30)) async -> Bool {
            await waitForConnection(within: limit) { true } ?? false
        }

        /// Runs `action` the moment a client connects, on the waiting thread: not once the test's
        /// task is scheduled again, which a busy test process can delay past the client's own
        /// limits. Nil when nobody connected within `limit`.
        package func waitForConnection<T: Sendable>(within limit: Duration = .seconds(30), then action: @escaping @Sendable () -> T) async -> T? {
            let (descriptor, milliseconds) = (self.descriptor, Int32(limit.components.seconds * 1000))
            return await withCheckedContinuation { continuation in
                Thread {
                    var ready = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                    continuation.resume(returning: Glibc.poll(&ready, 1, milliseconds) == 1 ? action() : nil)
                }.start()
            }
        }
    }

    /// A socket bound to a free loopback port (listening or not) and the port the kernel chose.
    static func bindLoopback(listening: Bool) -> (descriptor: Int32, port: Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        precondition(descriptor >= 0, "socket: \(String(cString: strerror(errno)))")
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, length) == 0 && (!listening || listen(descriptor, 16) == 0) && getsockname(descriptor, $0, &length) == 0
            }
        }
        precondition(bound, "bind\(listening ? "/listen" : ""): \(String(cString: strerror(errno)))")
        return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
    }

    /// Runs the binary with its stdout and stderr in one file, SIGKILLed (status 137) if it has not
    /// exited within `limit`: for a command that must stop by itself.
    package static func run(
        _ arguments: [String], environment: [String: String], directory: String, within limit: Duration
    ) async throws -> (status: Int32, output: String) {
        let log = "\(directory)/run-\(UUID().uuidString.prefix(6)).log"
        defer { try? FileManager.default.removeItem(atPath: log) }
        let child = try Subprocess.start(
            url.path, arguments, environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, workingDirectory: directory,
            outputPath: log)
        let watchdog = after(limit) { child.signal(SIGKILL) }
        let status = await child.waitForExit()
        watchdog.cancel()
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        return (status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f), output)
    }

    /// A new directory `/tmp/siwa-NAME-xxxxxx`, open to other users (0755): the embedded
    /// cluster's unprivileged account must reach what a test puts there.
    package static func makeDirectory(_ name: String) throws -> String {
        let directory = "/tmp/siwa-\(name)-\(UUID().uuidString.prefix(6).lowercased())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        return directory
    }

    /// A DATABASE_URL for a fresh migrated test database (unix socket).
    package static func databaseURL() async throws -> String {
        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        return "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"
    }


    /// A signing key of our own (Apple's format), its JWKS as a file:// URL, and bodies signed with it.
    package struct Keys {
        package let directory: String
        package let signer: AppleStyleSigner
        package let aud = "com.example.deploy"
        package var jwksURL: String { "file://\(directory)/keys/jwks.json" }

        package static func make() async throws -> Keys {
            let directory = "/tmp/siwa-deploy-\(UUID().uuidString.prefix(6).lowercased())"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            let generated = try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory)
            #expect(generated.status == 0)
            return Keys(directory: directory, signer: try AppleStyleSigner(pem: String(contentsOfFile: "\(directory)/keys/private-key.pem", encoding: .utf8)))
        }

        package func remove() { try? FileManager.default.removeItem(atPath: directory) }

        package func bodies(count: Int, prefix: String, users: Int = 100) throws -> [(jti: String, body: String)] {
            let types = ["email-disabled", "email-enabled", "consent-revoked", "account-delete"]
            return try (0..<count).map { index in
                let type = types[index % types.count]
                let jti = "\(prefix)-\(index)"
                let token = try signer.notification(
                    aud: aud, type: type, sub: "001.\(prefix).\(index % users)", eventTime: Date().addingTimeInterval(Double(index) / 1000),
                    email: type.hasPrefix("email") ? "\(prefix)\(index)@privaterelay.appleid.com" : nil, isPrivateEmail: type.hasPrefix("email") ? true : nil,
                    jti: jti)
                return (jti, AppleStyleSigner.body(token))
            }
        }
    }

    /// A `serve` child that bound port 0 on both listeners and logged the ports the kernel gave it:
    /// no port is chosen in advance, so none can be taken by another bind in between.
    package struct Serving: Sendable {
        package let process: ChildProcess
        package let output: ChildOutput
        /// The public listener's port (`siwa-events listening`).
        package let port: Int
        /// The admin listener's port (`admin listener (API, dashboard, metrics)`).
        package let adminPort: Int
    }

    /// Starts `siwa-events serve` (or `arguments`) with SIWA_PORT=0 and SIWA_ADMIN_PORT=0, the
    /// process's environment (less the variables `unsetting` names) under `environment`, and returns once both listeners logged their
    /// address and — unless `ready` is false — the key set is loaded (a receiver is ready then: its
    /// database opened before the listeners). Throws, with the child's output, on either missing.
    package static func startServing(
        _ arguments: [String] = ["serve"], environment: [String: String], unsetting: (String) -> Bool = { _ in false }, directory: String? = nil,
        ready: Bool = true, within limit: Duration = .seconds(90)
    ) async throws -> Serving {
        let (process, output) = try ChildOutput.start(
            url.path, arguments,
            environment: ProcessInfo.processInfo.environment.filter { !unsetting($0.key) }.merging(environment) { $1 }
                .merging(["SIWA_PORT": "0", "SIWA_ADMIN_PORT": "0"]) { $1 },
            workingDirectory: directory ?? FileManager.default.currentDirectoryPath)
        func fail(_ what: String) -> any Error {
            process.signal(SIGKILL)
            return ServingFailed(description: "siwa-events \(arguments.joined(separator: " ")): no \(what) within \(limit): \(output.text.suffix(4000))")
        }
        guard let port = await output.port(loggedWith: "siwa-events listening", within: limit) else { throw fail("'siwa-events listening' with its address") }
        guard let adminPort = await output.port(loggedWith: "admin listener (API, dashboard, metrics)", within: limit) else {
            throw fail("'admin listener' with its address")
        }
        // The worker role loads no keys: its readiness is the database, open already.
        if ready && !arguments.contains("worker") {
            guard await output.wait(forAnyOf: ["apple keys fetched", "apple keys loaded from database"], within: limit) else {
                throw fail("'apple keys fetched' (readiness)")
            }
        }
        return Serving(process: process, output: output, port: port, adminPort: adminPort)
    }

    package struct ServingFailed: Error, CustomStringConvertible {
        package let description: String
    }

    /// One GET of `url`: its status, nil without an answer.
    package static func status(_ http: HTTPClient, _ url: String) async -> Int? {
        guard let response = try? await http.execute(HTTPClientRequest(url: url), timeout: .seconds(3)) else { return nil }
        _ = try? await response.body.collect(upTo: 1 << 16)
        return Int(response.status.code)
    }

    /// One GET of `url`: its status and body, nil without an answer.
    package static func get(_ http: HTTPClient, _ url: String) async -> (status: Int, body: String)? {
        guard let response = try? await http.execute(HTTPClientRequest(url: url), timeout: .seconds(10)),
            let body = try? await response.body.collect(upTo: 1 << 16)
        else { return nil }
        return (Int(response.status.code), String(buffer: body))
    }

    /// A client on the database a `TestBinary.databaseURL()` names (same cluster, same user).
    @discardableResult
    package static func withDatabase<T: Sendable>(_ url: String, _ body: (PostgresClient) async throws -> T) async throws -> T {
        let components = try #require(URLComponents(string: url))
        let socketDirectory = try #require(components.queryItems?.first { $0.name == "host" }?.value)
        let configuration = PostgresClient.Configuration(
            unixSocketPath: "\(socketDirectory)/.s.PGSQL.5432", username: components.user ?? "", password: nil,
            database: String(components.path.dropFirst()))
        let client = PostgresClient(configuration: configuration)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    package static func count(_ client: PostgresClient, _ query: PostgresQuery) async throws -> Int {
        for try await (n,) in try await client.query(query).decode((Int,).self) { return n }
        return 0
    }
}
