import Foundation
import Hummingbird
import Logging
import NIOCore
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Synchronization
import Testing

/// deploy/tls/'s nginx and Caddy configs, run by Debian's binaries: through them the internet
/// reaches only POST /apple/notifications and /health/*, never the admin listener's routes. Only the
/// certificate, the ports and the upstream (a stub that records what the proxy passed) differ.
@Suite("Proxy configs: deploy/tls/nginx.conf and Caddyfile with Debian's nginx and caddy", .timeLimit(.minutes(10)))
struct ProxyConfigTests {
    static let tls = Repository.deploy.appendingPathComponent("tls")

    /// What each request through the proxy must do.
    enum Expected {
        /// Passed to the upstream once, with exactly this request target (normalized by the proxy).
        case passed(String)
        /// Answered by the proxy itself with one of these statuses; the upstream never sees it.
        case refused([Int])
        /// A strange spelling: refused, or passed with one of the canonical public targets only.
        case refusedOrCanonical
    }

    static let publicTargets: Set<String> = ["POST /apple/notifications", "GET /health/live", "GET /health/ready"]

    static let requests: [(method: String, target: String, expected: Expected)] = [
        ("POST", "/apple/notifications", .passed("/apple/notifications")),
        ("GET", "/health/live", .passed("/health/live")),
        ("GET", "/health/ready", .passed("/health/ready")),
        // The admin listener's routes: the backend API, the dashboard, the API description, metrics.
        ("GET", "/v1/notifications", .refused([404])),
        ("POST", "/v1/tokens", .refused([404])),
        ("GET", "/", .refused([404])),
        ("GET", "/app.js", .refused([404])),
        ("GET", "/app.css", .refused([404])),
        ("GET", "/openapi.yaml", .refused([404])),
        ("GET", "/metrics", .refused([404])),
        // Apple's route with another method: 403 (nginx limit_except) or 405 (Caddy).
        ("GET", "/apple/notifications", .refused([403, 405])),
        ("DELETE", "/apple/notifications", .refused([403, 405])),
        // Path tricks (sent as written: curl --path-as-is).
        ("GET", "/health/../v1/notifications", .refused([404])),
        ("GET", "/health/..%2Fmetrics", .refused([404])),
        ("POST", "/apple/notifications/../../metrics", .refused([404])),
        ("GET", "//metrics", .refused([404])),
        ("GET", "/v1/../health/ready", .refusedOrCanonical),
        ("POST", "/v1/../apple/notifications", .refusedOrCanonical),
    ]

    @Test("nginx (Debian's 1.22): nginx -t accepts deploy/tls/nginx.conf; only POST /apple/notifications and /health/* reach the upstream, over HTTP/2")
    func nginx() async throws {
        let nginx = try #require(
            ["/usr/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "nginx is not installed: scripts/test installs Debian's nginx package")
        let shipped = try String(contentsOf: Self.tls.appendingPathComponent("nginx.conf"), encoding: .utf8)
        // Upstream connections must be closed by nginx before siwa-events closes them.
        let idle = shipped.firstMatch(of: /keepalive_timeout\s+(\d+)s;/).flatMap { Int($0.1) }
        #expect(idle.map { $0 < Self.siwaIdleTimeout } == true, "nginx.conf: upstream keepalive_timeout \(idle.map(String.init) ?? "not set")")

        let work = try await Workspace.make()
        defer { work.remove() }
        let upstream = try await Upstream.start()
        defer { Task { await upstream.stop() } }
        let (https, http) = (TestBinary.freePort(), TestBinary.freePort())
        // The listen addresses on loopback (IPv6 may be missing in a CI container), the test's
        // certificate, the stub upstream.
        let site = try Self.edit(shipped, [
            ("listen 443 ssl http2;", "listen 127.0.0.1:\(https) ssl http2;"),
            ("listen [::]:443 ssl http2;", ""),
            ("listen 80;", "listen 127.0.0.1:\(http);"),
            ("listen [::]:80;", ""),
            ("/etc/letsencrypt/live/siwa.example.com/fullchain.pem", work.certificate),
            ("/etc/letsencrypt/live/siwa.example.com/privkey.pem", work.key),
            ("127.0.0.1:8080", "127.0.0.1:\(upstream.port)"),
        ])
        try site.write(toFile: "\(work.directory)/siwa-events.conf", atomically: true, encoding: .utf8)
        // The distribution's nginx.conf reduced to what the site needs: the shipped file goes
        // inside http {}, as /etc/nginx/sites-enabled/ does. Everything nginx writes stays here.
        let main = """
            daemon off;
            worker_processes 1;
            pid \(work.directory)/nginx.pid;
            error_log stderr info;
            events { worker_connections 64; }
            http {
                access_log off;
                client_body_temp_path \(work.directory)/client_body;
                proxy_temp_path \(work.directory)/proxy;
                fastcgi_temp_path \(work.directory)/fastcgi;
                uwsgi_temp_path \(work.directory)/uwsgi;
                scgi_temp_path \(work.directory)/scgi;
                include \(work.directory)/siwa-events.conf;
            }
            """
        try main.write(toFile: "\(work.directory)/nginx.conf", atomically: true, encoding: .utf8)
        let arguments = ["-p", work.directory, "-e", "stderr", "-c", "\(work.directory)/nginx.conf"]

        let check = try await Subprocess.run(nginx, ["-t"] + arguments, environment: ProcessInfo.processInfo.environment)
        #expect(check.succeeded && check.combinedOutput.contains("test is successful"), "nginx -t: \(check.combinedOutput)")
        guard check.succeeded else { return }

        // In the foreground, never as the system's service. Its listeners are open once it starts its workers.
        let (server, output) = try ChildOutput.start(nginx, arguments, environment: ProcessInfo.processInfo.environment, workingDirectory: work.directory)
        await Self.stopping(server) {
            try await Self.checkRoutes(https: https, upstream: upstream, work: work, output: output, ready: "start worker processes")
            // Plain HTTP: a redirect to HTTPS, answered by nginx alone.
            let plain = try await Self.curl("GET", "http://siwa.example.com:\(http)/v1/notifications", port: http, id: "plain", work: work)
            #expect(plain.status == 301, "plain HTTP: \(plain)")
            #expect(upstream.received(id: "plain").isEmpty, "plain HTTP reached the upstream")
        }
    }

    @Test("Caddy (Debian's 2.6): caddy validate accepts deploy/tls/Caddyfile; only POST /apple/notifications and /health/* reach the upstream, over HTTP/2")
    func caddy() async throws {
        let caddy = try #require(
            ["/usr/bin/caddy", "/usr/local/bin/caddy"].first { FileManager.default.isExecutableFile(atPath: $0) },
            "caddy is not installed: scripts/test installs Debian's caddy package")
        let shipped = try String(contentsOf: Self.tls.appendingPathComponent("Caddyfile"), encoding: .utf8)
        let idle = shipped.firstMatch(of: /keepalive\s+(\d+)m\b/).flatMap { Int($0.1) }
        #expect(idle.map { $0 * 60 < Self.siwaIdleTimeout } == true, "Caddyfile: transport keepalive \(idle.map { "\($0)m" } ?? "not set")")

        let work = try await Workspace.make()
        defer { work.remove() }
        let upstream = try await Upstream.start()
        defer { Task { await upstream.stop() } }
        let (https, http) = (TestBinary.freePort(), TestBinary.freePort())
        // Offline: the test's certificate instead of ACME, no admin endpoint (:2019), no redirect
        // listener, storage in the workspace.
        let global = """
            {
            \tadmin off
            \tauto_https disable_redirects
            \thttp_port \(http)
            \thttps_port \(https)
            \tstorage file_system \(work.directory)/caddy
            }

            """
        let site = try Self.edit(shipped, [
            ("siwa.example.com {", "siwa.example.com:\(https) {\n\ttls \(work.certificate) \(work.key)"),
            ("reverse_proxy 127.0.0.1:8080 {", "reverse_proxy 127.0.0.1:\(upstream.port) {"),
        ])
        let config = "\(work.directory)/Caddyfile"
        try (global + site).write(toFile: config, atomically: true, encoding: .utf8)
        let environment = ["PATH": "/usr/bin:/bin", "HOME": work.directory, "XDG_DATA_HOME": "\(work.directory)/xdg", "XDG_CONFIG_HOME": "\(work.directory)/xdg"]

        let check = try await Subprocess.run(caddy, ["validate", "--config", config, "--adapter", "caddyfile"], environment: environment)
        #expect(check.succeeded && check.combinedOutput.contains("Valid configuration"), "caddy validate: \(check.combinedOutput)")
        guard check.succeeded else { return }

        // Its servers listen once it logs that it serves the configuration.
        let (server, output) = try ChildOutput.start(
            caddy, ["run", "--config", config, "--adapter", "caddyfile"], environment: environment, workingDirectory: work.directory)
        await Self.stopping(server) {
            try await Self.checkRoutes(https: https, upstream: upstream, work: work, output: output, ready: "serving initial configuration")
        }
    }

    /// siwa-events' HTTP idle timeout (SIWA_HTTP_IDLE_TIMEOUT's default, seconds): a proxy must
    /// close idle upstream connections before it does.
    static let siwaIdleTimeout = 150

    // MARK: Through the proxy

    /// Every request of `requests` through the proxy on `https` once its `output` has logged
    /// `ready`, each tagged so the upstream's records are attributed to it; then the upstream's
    /// whole record checked.
    static func checkRoutes(https: Int, upstream: Upstream, work: Workspace, output: ChildOutput, ready: String) async throws {
        let base = "https://siwa.example.com:\(https)"
        let started = await output.wait(for: ready, within: .seconds(20))
        #expect(started, "the proxy did not log '\(ready)' within 20 s:\n\(output.text)")
        guard started else { return }

        for (index, request) in requests.enumerated() {
            let id = "r\(index)"
            let answer = try await curl(request.method, base + request.target, port: https, id: id, work: work)
            let reached = upstream.received(id: id)
            let name = "\(request.method) \(request.target)"
            switch request.expected {
            case .passed(let target):
                #expect(answer.status == 200, "\(name): \(answer)")
                #expect(answer.httpVersion == "2", "\(name): HTTP/\(answer.httpVersion), not HTTP/2")
                #expect(reached.map(\.target) == [target], "\(name): the upstream got \(reached.map(\.target))")
                // The client's own X-Forwarded-For is replaced by the proxy's view of it.
                #expect(reached.map(\.forwardedFor) == ["127.0.0.1"], "\(name): X-Forwarded-For \(reached.map(\.forwardedFor))")
            case .refused(let statuses):
                // A proxy that answers before reading a request's body may reset the HTTP/2 stream
                // under curl's upload (curl 92): refused all the same.
                #expect(statuses.contains(answer.status) || answer.error.contains("(92)"), "\(name): \(answer), expected \(statuses)")
                #expect(reached.isEmpty, "\(name) reached the upstream as \(reached.map(\.target))")
            case .refusedOrCanonical:
                #expect(reached.isEmpty ? answer.status == 404 : answer.status == 200, "\(name): \(answer)")
                #expect(reached.count <= 1, "\(name): \(reached.map(\.target))")
            }
        }
        // Whatever the request, the upstream saw only the public routes, spelled canonically.
        for record in upstream.all {
            let path = String(record.target.prefix { $0 != "?" })
            #expect(publicTargets.contains("\(record.method) \(path)"), "the upstream got \(record.method) \(record.target) (request \(record.id))")
        }
    }

    struct Answer: CustomStringConvertible {
        var status: Int
        var httpVersion: String
        var error: String
        var description: String { status == 0 ? "no answer: \(error)" : "\(status) over HTTP/\(httpVersion)" }
    }

    /// One request with curl: the path as written (no client-side normalization), the test's CA,
    /// siwa.example.com resolved to loopback, a forged X-Forwarded-For, a bounded time.
    static func curl(_ method: String, _ url: String, port: Int, id: String, work: Workspace) async throws -> Answer {
        var arguments = [
            "curl", "--silent", "--show-error", "--path-as-is", "--max-time", "5", "--cacert", work.certificate,
            "--resolve", "siwa.example.com:\(port):127.0.0.1", "--output", "/dev/null", "--write-out", "%{http_code} %{http_version}",
            "--request", method, "--header", "X-Test-Request: \(id)", "--header", "X-Forwarded-For: 203.0.113.9",
        ]
        if method == "POST" { arguments += ["--header", "Content-Type: application/json", "--data-binary", #"{"payload":"test"}"#] }
        let result = try await Subprocess.run("/usr/bin/env", arguments + [url], environment: ["PATH": "/usr/bin:/bin"])
        let fields = result.standardOutput.split(separator: " ")
        return Answer(
            status: fields.first.flatMap { Int($0) } ?? 0, httpVersion: fields.count > 1 ? String(fields[1]) : "",
            error: result.standardError.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Runs `body` while `process` runs, then stops it (SIGTERM: both exit at once) and reaps it.
    static func stopping(_ process: ChildProcess, _ body: () async throws -> Void) async {
        do { try await body() } catch { Issue.record(error) }
        process.signal(SIGTERM)
        _ = await process.waitForExit()
    }

    // MARK: Helpers

    /// `text` with each `old` replaced; an `old` the shipped file no longer contains fails the
    /// test by name instead of silently testing something else.
    static func edit(_ text: String, _ replacements: [(String, String)]) throws -> String {
        var text = text
        for (old, new) in replacements {
            try #require(text.contains(old), "the shipped file no longer contains \(old.debugDescription): update the test's edits")
            text = text.replacingOccurrences(of: old, with: new)
        }
        return text
    }

    /// A directory for one proxy's configuration, certificate and logs.
    struct Workspace {
        let directory: String
        var certificate: String { "\(directory)/siwa.example.com.pem" }
        var key: String { "\(directory)/siwa.example.com.key" }

        /// Makes the directory and a self-signed certificate for the shipped server name (openssl
        /// req -x509 makes it its own CA); openssl is waited for off the cooperative pool.
        static func make() async throws -> Workspace {
            let directory = "/tmp/siwa-proxy-\(UUID().uuidString.prefix(6).lowercased())"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            let made = try await Subprocess.run(
                "/usr/bin/env",
                [
                    "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "\(directory)/siwa.example.com.key",
                    "-out", "\(directory)/siwa.example.com.pem", "-days", "2", "-subj", "/CN=siwa.example.com", "-addext",
                    "subjectAltName=DNS:siwa.example.com",
                ], environment: ProcessInfo.processInfo.environment)
            try #require(made.status == 0 && !made.terminatedBySignal, "openssl could not make the test certificate: \(made.standardError)")
            return Workspace(directory: directory)
        }

        func remove() { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// The stand-in for siwa-events' public listener: answers every request 200 and records it
    /// (method, request target as received, X-Forwarded-For, the test's request tag).
    final class Upstream: Sendable {
        struct Record: Sendable {
            var id: String
            var method: String
            var target: String
            var forwardedFor: String
        }

        final class Recorder: Sendable {
            let records = Mutex<[Record]>([])
        }

        let port: Int
        private let recorder: Recorder
        private let task: Task<Void, any Error>

        private init(port: Int, recorder: Recorder, task: Task<Void, any Error>) {
            self.port = port
            self.recorder = recorder
            self.task = task
        }

        static func start() async throws -> Upstream {
            let recorder = Recorder()
            let responder = CallbackResponder<BasicRequestContext> { request, _ in
                _ = try await request.body.collect(upTo: 1 << 20)
                func header(_ name: String) -> String {
                    request.headers.filter { $0.name.canonicalName == name }.map(\.value).joined(separator: ", ")
                }
                let record = Record(
                    id: header("x-test-request"), method: request.method.rawValue, target: request.head.path ?? "",
                    forwardedFor: header("x-forwarded-for"))
                recorder.records.withLock { $0.append(record) }
                return Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "upstream")))
            }
            let (ports, continuation) = AsyncStream<Int>.makeStream()
            let app = Application(
                responder: responder, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                onServerRunning: { continuation.yield($0.localAddress?.port ?? 0) },
                logger: Logger(label: "proxy-upstream", factory: { _ in SwiftLogNoOpLogHandler() }))
            let task = Task { try await app.run() }
            var iterator = ports.makeAsyncIterator()
            let port = try #require(await iterator.next())
            return Upstream(port: port, recorder: recorder, task: task)
        }

        var all: [Record] { recorder.records.withLock { $0 } }
        func received(id: String) -> [Record] { all.filter { $0.id == id } }

        func stop() async {
            task.cancel()
            _ = await task.result
        }
    }
}
