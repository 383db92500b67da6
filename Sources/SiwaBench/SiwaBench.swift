import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaDomain

/// Benchmarks for BENCHMARKS.md: signed notifications over real HTTP to a running server on the
/// real store, and raw RS256 verification on one core. Not a test: it reports figures.
@main
struct SiwaBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "siwa-bench", abstract: "Benchmarks for siwa-events.",
        subcommands: [Sign.self, Ingest.self, Verify.self, History.self, KeptTokens.self, Sessions.self, LogLines.self])
}

/// Pre-signs notifications (signing is ~1 ms each, so it is done before the clock starts).
struct Sign: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Sign N distinct notifications into a file, one POST body per line.")
    @Option(help: "Directory with private-key.pem (from `siwa-events keys generate`).") var keys: String
    @Option(help: "Bundle ID for aud.") var aud: String
    @Option(help: "How many.") var count: Int
    @Option(help: "Output file.") var output: String
    @Option(help: "Comma-separated event types, used in turn.") var types: String = "email-disabled,email-enabled,consent-revoked,account-delete"

    func run() async throws {
        let pem = try String(contentsOfFile: keys + "/private-key.pem", encoding: .utf8)
        let signer = try AppleStyleSigner(pem: pem)
        let types = self.types.split(separator: ",").map(String.init)
        let workers = max(1, ProcessInfo.processInfo.activeProcessorCount)
        let base = Date()
        let run = UUID().uuidString.prefix(8)
        let lines = try await withThrowingTaskGroup(of: [String].self) { group in
            for worker in 0..<workers {
                group.addTask {
                    var lines: [String] = []
                    for index in stride(from: worker, to: count, by: workers) {
                        let type = types[index % types.count]
                        let jws = try signer.notification(
                            aud: aud, type: type, sub: "000\(index % 997).bench\(run).\(index)", eventTime: base.addingTimeInterval(Double(index) / 1000),
                            email: type.hasPrefix("email") ? "bench\(index)@privaterelay.appleid.com" : nil,
                            isPrivateEmail: type.hasPrefix("email") ? true : nil, jti: "bench-\(run)-\(index)")
                        lines.append(AppleStyleSigner.body(jws))
                    }
                    return lines
                }
            }
            return try await group.reduce(into: [String]()) { $0 += $1 }
        }
        try (lines.joined(separator: "\n") + "\n").write(toFile: output, atomically: true, encoding: .utf8)
        print("signed \(lines.count) notifications into \(output)")
    }
}

struct Ingest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "POST pre-signed notifications and report accepted/s and latency percentiles.")
    @Option(help: "Server base URL.") var url: String
    @Option(help: "File of POST bodies (from `siwa-bench sign`).") var bodies: String
    @Option(help: "Concurrent connections.") var connections: Int = 16
    @Option(help: "Use bodies starting at this line (so runs don't repeat notifications).") var offset: Int = 0
    @Option(help: "Requests to send.") var requests: Int
    @Option(help: "Target rate in requests/s (open loop); default: as fast as the connections go.") var rate: Double?
    @Option(help: "Label for the output line.") var label: String = "ingest"
    @Option(help: "Also print a line every N seconds with that interval's answers/s and latency (long runs).") var reportEvery: Int?

    func run() async throws {
        let all = try String(contentsOfFile: bodies, encoding: .utf8).split(separator: "\n").map(String.init)
        guard offset + requests <= all.count else {
            throw ValidationError("--offset \(offset) + --requests \(requests) exceeds the \(all.count) bodies in \(bodies)")
        }
        guard let base = URLComponents(string: url), base.scheme == "http", let host = base.host else {
            throw ValidationError("--url \(url): expected http://HOST[:PORT] (the load generator speaks plain HTTP/1.1)")
        }
        let port = base.port ?? 80
        // Every request encoded before the clock starts (see OpenLoopLoad).
        let encoded = all[offset..<(offset + requests)].map { OpenLoopLoad.post(path: "/apple/notifications", host: host, json: Substring($0)) }
        let results = Results(capacity: requests)
        let started = ContinuousClock.now
        let reporter = reportEvery.map { every in
            Task {
                var cursor = 0
                var tick = 0
                while !Task.isCancelled {
                    tick += 1
                    try? await Task.sleep(until: started + .seconds(every * tick), clock: .continuous)
                    if Task.isCancelled { break }
                    let (latencies, _) = results.snapshot()
                    let interval = latencies[cursor...].sorted()
                    cursor = latencies.count
                    func at(_ p: Double) -> Double { interval.isEmpty ? .nan : interval[min(interval.count - 1, Int((Double(interval.count) * p).rounded(.up)) - 1)] }
                    let line = String(format: "%@: t=%ds answers/s=%.0f p50=%.2fms p99=%.2fms\n", label, every * tick, Double(interval.count) / Double(every), at(0.5), at(0.99))
                    FileHandle.standardOutput.write(Data(line.utf8))
                }
            }
        }
        defer { reporter?.cancel() }
        try await OpenLoopLoad.run(host: host, port: port, connections: connections, requests: encoded, rate: rate, results: results)
        let elapsed = ContinuousClock.now - started
        let (latencies, statuses) = results.snapshot()
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let accepted = statuses[200, default: 0]
        func percentile(_ p: Double) -> Double {
            guard !latencies.isEmpty else { return .nan }
            let sorted = latencies.sorted()
            return sorted[min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.up)) - 1)]
        }
        let line = String(
            format: "%@: connections=%d requests=%d ok=%d accepted/s=%.0f p50=%.2fms p99=%.2fms max=%.2fms statuses=%@",
            label, connections, requests, accepted, Double(accepted) / seconds, percentile(0.50), percentile(0.99), percentile(1.0),
            statuses.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","))
        print(line)
    }
}

/// Raw RS256 verification (parse, signature, claims, event decoding) on one core.
struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Verifications per second on one core.")
    @Option(help: "Seconds to run.") var seconds: Double = 5

    func run() async throws {
        let signer = try AppleStyleSigner.generate()
        let keys = try AppleKeySet.parse(try signer.jwksDocument())
        let jws = try signer.notification(aud: "com.example.bench", type: "email-disabled", sub: "001.bench.1", email: "x@privaterelay.appleid.com", isPrivateEmail: true)
        let verifier = NotificationVerifier(audiences: ["com.example.bench"])
        let now = Date()
        let thread = Thread {
            let clock = ContinuousClock()
            let start = clock.now
            var count = 0
            while clock.now - start < .milliseconds(Int64(seconds * 1000)) {
                for _ in 0..<100 {
                    _ = try! verifier.verify(jws, keys: keys, now: now)
                }
                count += 100
            }
            let elapsed = clock.now - start
            let total = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            print(String(format: "verify: %.0f RS256 verifications/s on one core (%d in %.1fs, full notification checks incl. JSON and event decoding)", Double(count) / total, count, total))
        }
        thread.start()
        while !thread.isFinished { try await Task.sleep(for: .milliseconds(50)) }
    }
}

final class Results: @unchecked Sendable {
    private let lock = NSLock()
    private var latencies: [Double]
    private var statuses: [UInt: Int] = [:]
    init(capacity: Int) { latencies = []; latencies.reserveCapacity(capacity) }
    func add(latency: Duration, status: UInt) {
        let ms = Double(latency.components.seconds) * 1000 + Double(latency.components.attoseconds) / 1e15
        lock.lock()
        latencies.append(ms)
        statuses[status, default: 0] += 1
        lock.unlock()
    }
    func snapshot() -> ([Double], [UInt: Int]) {
        lock.lock()
        defer { lock.unlock() }
        return (latencies, statuses)
    }
}

/// History API latency over real HTTP, one request at a time: a user's notifications, a time-range
/// page, hourly stats for 7 days, and NDJSON export throughput.
struct History: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Query the history API and report latency percentiles and export rows/s.")
    @Option(help: "Server base URL.") var url: String
    @Option(help: "A token with notifications:read.") var token: String
    @Option(help: "Users are <prefix>-user-<n>.") var prefix: String = "hist"
    @Option(help: "How many users were loaded.") var users: Int = 100_000
    @Option(help: "Requests per query kind.") var requests: Int = 500

    func run() async throws {
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        func get(_ path: String) async throws -> (Duration, Int) {
            var request = HTTPClientRequest(url: url + path)
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
            let started = ContinuousClock.now
            let response = try await client.execute(request, timeout: .seconds(120))
            var bytes = 0
            var lines = 0
            for try await chunk in response.body {
                bytes += chunk.readableBytes
                lines += chunk.readableBytesView.lazy.filter { $0 == UInt8(ascii: "\n") }.count
            }
            guard response.status == .ok else { throw ValidationError("GET \(path) answered \(response.status.code)") }
            return (ContinuousClock.now - started, lines)
        }
        func report(_ label: String, _ path: (Int) -> String, count: Int) async throws {
            var latencies: [Double] = []
            for index in 0..<count {
                let (elapsed, _) = try await get(path(index))
                latencies.append(Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)
            }
            latencies.sort()
            func p(_ q: Double) -> Double { latencies[min(latencies.count - 1, Int((Double(latencies.count) * q).rounded(.up)) - 1)] }
            print(String(format: "%@: n=%d p50=%.2fms p99=%.2fms max=%.2fms", label, count, p(0.5), p(0.99), p(1.0)))
        }
        let now = Date()
        func iso(_ date: Date) -> String { date.formatted(.iso8601) }
        try await report("history by sub", { "/v1/notifications?sub=\(prefix)-user-\(($0 * 7919) % users)" }, count: requests)
        try await report("history time-range page (1 h window, 100 rows)", { index in
            let end = now.addingTimeInterval(-Double((index * 3571) % (6 * 86_400)))
            return "/v1/notifications?from=\(iso(end.addingTimeInterval(-3600)))&to=\(iso(end))&limit=100"
        }, count: requests)
        try await report("history hourly stats, 7 days", { _ in "/v1/stats/notifications?bucket=hour&from=\(iso(now.addingTimeInterval(-7 * 86_400)))" }, count: 100)
        try await report("history daily stats, 90 days", { _ in "/v1/stats/notifications?bucket=day" }, count: 100)
        let (elapsed, lines) = try await get("/v1/notifications/export")
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        print(String(format: "history export: %d rows in %.1fs = %.0f rows/s (NDJSON over HTTP)", lines, seconds, Double(lines) / seconds))
        try await client.shutdown()
    }
}

/// `POST /v1/sessions` latency, one request at a time on one kept-alive connection: a session the
/// backend vouches for (`aud`+`sub`) beside one completed with an authorization code exchanged at
/// the stand-in for Apple's `/auth/token` (`siwa-events standin serve`). Codes are issued before
/// the clock starts; each request is a new user.
struct Sessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "POST /v1/sessions: aud+sub vs authorization_code, latency percentiles.")
    @Option(help: "The server's admin base URL.") var url: String
    @Option(help: "A token with sessions:write.") var token: String
    @Option(help: "The stand-in's base URL.") var standin: String
    @Option(help: "The bundle ID (and client ID) users sign in to.") var aud: String
    @Option(help: "Requests per kind (after as many again to warm up).") var requests: Int = 1000

    func run() async throws {
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(connectionPool: .init(idleTimeout: .seconds(60))))
        defer { _ = client.shutdown() }
        let run = UUID().uuidString.prefix(8)
        func post(_ base: String, _ path: String, _ body: JSONValue, token: String? = nil) async throws -> (Duration, UInt, String) {
            var request = HTTPClientRequest(url: base + path)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
            request.body = .bytes(ByteBuffer(string: body.jsonText))
            let started = ContinuousClock.now
            let response = try await client.execute(request, timeout: .seconds(60))
            let bytes = try await response.body.collect(upTo: 1 << 20)
            return (ContinuousClock.now - started, response.status.code, String(buffer: bytes))
        }
        func code(_ sub: String) async throws -> String {
            let (_, status, body) = try await post(standin, "/standin/codes", ["client_id": .string(aud), "sub": .string(sub)])
            guard status == 200, let code = JSONValue.parse(Data(body.utf8))?["code"]?.stringValue else {
                throw ValidationError("the stand-in did not issue a code (\(status)): \(body)")
            }
            return code
        }
        func measure(_ label: String, _ bodies: [JSONValue]) async throws {
            var latencies: [Double] = []
            for body in bodies {
                let (elapsed, status, answer) = try await post(url, "/v1/sessions", body, token: token)
                guard status == 201 else { throw ValidationError("\(label): POST /v1/sessions answered \(status): \(answer)") }
                latencies.append(Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15)
            }
            latencies.sort()
            func p(_ q: Double) -> Double { latencies[min(latencies.count - 1, Int((Double(latencies.count) * q).rounded(.up)) - 1)] }
            print(String(format: "%@: n=%d p50=%.2fms p99=%.2fms max=%.2fms", label, latencies.count, p(0.5), p(0.99), p(1.0)))
        }
        for round in ["warm-up", "measured"] {
            let vouched = (0..<requests).map { JSONValue.object(["aud": .string(aud), "sub": .string("001.\(run).\(round).v\($0)")]) }
            var exchanged: [JSONValue] = []
            for index in 0..<requests { exchanged.append(["authorization_code": .string(try await code("001.\(run).\(round).c\(index)"))]) }
            if round == "warm-up" {
                for body in vouched + exchanged { _ = try await post(url, "/v1/sessions", body, token: token) }
                continue
            }
            try await measure("sessions aud+sub", vouched)
            try await measure("sessions authorization_code", exchanged)
        }
    }
}
