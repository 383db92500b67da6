import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Synchronization
import Testing

/// A primary with a synchronous standby (`pg_basebackup`), each behind a TCP "host" of its own,
/// and the real binary on a two-host DATABASE_URL with `target_session_attrs=read-write`, no proxy
/// or virtual IP: the primary is lost, the standby promoted, and the service finds it itself.
@Suite("Failover: a two-host DATABASE_URL follows the promoted standby", .timeLimit(.minutes(10)), .serialized)
struct FailoverTests {
    @Test("The primary stops (-m immediate) under load: accepted again within 5 s of the promotion, nothing answered 200 lost, effects applied after, never restarted")
    func primaryStops() async throws {
        try await Self.failover(silent: false, backWithin: .seconds(5))
    }

    @Test("The primary's host goes silent (its sockets held open, nothing answered) under load: accepted again within 15 s of the promotion, nothing lost")
    func primaryGoesSilent() async throws {
        try await Self.failover(silent: true, backWithin: .seconds(15))
    }

    static func failover(silent: Bool, backWithin limit: Duration) async throws {
        let pair = try await ReplicatedPair.start()
        defer { pair.remove() }
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let bodies = try keys.bodies(count: 4_000, prefix: silent ? "silent" : "stop", users: 500)
        let hostA = TCPProxy(target: pair.primarySocket)
        let hostB = TCPProxy(target: pair.standbySocket)
        let (portA, portB) = (try await hostA.start(), try await hostB.start())
        let url = "postgres://\(pair.user)@127.0.0.1:\(portA),127.0.0.1:\(portB)/\(pair.database)?sslmode=disable&target_session_attrs=read-write"
        let environment = [
            "DATABASE_URL": url, "SIWA_EMBEDDED_DATABASE": "off", "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
        ]
        let migrated = try await TestBinary.run(["migrate"], environment: environment, directory: keys.directory)
        #expect(migrated.status == 0, "\(migrated.stderr)")
        let serving = try await TestBinary.startServing(environment: environment, directory: keys.directory)
        defer { serving.process.signal(SIGKILL) }

        let load = FailoverLoad(url: "http://127.0.0.1:\(serving.port)/apple/notifications", bodies: bodies)
        let running = Task { await load.run(senders: 4) }
        #expect(await load.acknowledged(atLeast: 100, within: .seconds(60)))

        if silent { hostA.silence() }
        try await pair.primary.stopImmediately()
        try await pair.standby.promote()
        let promoted = ContinuousClock.now
        let back = await load.firstAcknowledged(after: promoted, within: .seconds(60))
        // A few seconds more of load on the new primary, then stop.
        if back != nil { _ = await load.acknowledged(atLeast: load.count + 100, within: .seconds(30)) }
        load.stop()
        await running.value
        let backAfter = back.map { $0 - promoted }
        print("failover (\(silent ? "silent" : "stopped")): accepted again \(String(describing: backAfter)) after the promotion; \(load.count) acknowledged")
        #expect(backAfter.map { $0 < limit } == true, "accepted again after \(String(describing: backAfter)) (limit \(limit))")

        // Every notification answered 200 is on the new primary; those after the move are applied.
        let acknowledged = load.acknowledgedJTIs
        let afterMove = load.acknowledgedJTIs(after: promoted)
        #expect(!afterMove.isEmpty)
        try await pair.onStandby { client in
            let stored = try await Self.jtis(client, "SELECT jti FROM notifications")
            let lost = acknowledged.subtracting(stored)
            #expect(lost.isEmpty, "\(lost.count) of \(acknowledged.count) acknowledged notifications are not in the database: \(lost.prefix(5))")
            var pending = afterMove
            for _ in 0..<300 where !pending.isEmpty {
                pending.subtract(try await Self.jtis(client, "SELECT jti FROM notifications WHERE status = 'applied'"))
                if !pending.isEmpty { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(pending.isEmpty, "\(pending.count) notifications accepted after the move not applied")
        }
        // The same process served throughout: it never exited.
        #expect(kill(serving.process.pid, 0) == 0)
        #expect(!serving.output.text.contains("siwa-events stopped"))
        serving.process.signal(SIGTERM)
        _ = await serving.process.waitForExit()
        await hostA.stop()
        await hostB.stop()
    }

    static func jtis(_ client: PostgresClient, _ query: PostgresQuery) async throws -> Set<String> {
        var result = Set<String>()
        for try await (jti,) in try await client.query(query).decode((String,).self) { result.insert(jti) }
        return result
    }
}

/// A primary and its synchronous standby, in a directory of their own.
struct ReplicatedPair {
    let root: String
    let primary: EmbeddedPostgres
    let standby: EmbeddedPostgres
    let primarySocket: String
    let standbySocket: String
    let user: String
    let superuser: String
    let database: String

    static func start() async throws -> ReplicatedPair {
        let root = try TestBinary.makeDirectory("failover")
        let logger = Logger(label: "failover")
        let primary = EmbeddedPostgres(options: .init(dataDirectory: "\(root)/primary", durable: true, database: "siwa"), logger: logger)
        let p = try await primary.start()
        let standby = try await primary.makeStandby(dataDirectory: "\(root)/standby", name: "standby1")
        let s = try await standby.start()
        let pair = ReplicatedPair(
            root: root, primary: primary, standby: standby, primarySocket: p.socketPath, standbySocket: s.socketPath, user: p.username,
            superuser: p.superuser, database: p.database)
        // Synchronous from now on: every commit the primary acknowledges is on the standby too.
        try await pair.on(p.socketPath) { client in
            try await client.query("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            try await client.query("SELECT pg_reload_conf()")
            var sync = false
            for _ in 0..<200 where !sync {
                sync = try await TestBinary.count(client, "SELECT count(*)::bigint FROM pg_stat_replication WHERE sync_state = 'sync'") == 1
                if !sync { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(sync, "the standby never became synchronous")
        }
        return pair
    }

    func onStandby<T: Sendable>(_ body: (PostgresClient) async throws -> T) async throws -> T { try await on(standbySocket, body) }

    func on<T: Sendable>(_ socket: String, _ body: (PostgresClient) async throws -> T) async throws -> T {
        let client = PostgresClient(configuration: .init(unixSocketPath: socket, username: superuser, password: nil, database: database))
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }

    func remove() {
        let (primary, standby, root) = (self.primary, self.standby, self.root)
        Task {
            try? await primary.stopImmediately()
            try? await standby.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
    }
}

/// Senders posting distinct notifications until stopped; what each answer was, and when.
final class FailoverLoad: Sendable {
    private struct State {
        var next = 0
        var stopped = false
        var acknowledged: [(jti: String, at: ContinuousClock.Instant)] = []
    }
    private let state = Mutex(State())
    let url: String
    let bodies: [(jti: String, body: String)]

    init(url: String, bodies: [(jti: String, body: String)]) {
        self.url = url
        self.bodies = bodies
    }

    func run(senders: Int) async {
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<senders {
                group.addTask { await self.send(http) }
            }
        }
        try? await http.shutdown()
    }

    private func send(_ http: HTTPClient) async {
        while let index = state.withLock({ state -> Int? in
            guard !state.stopped, state.next < bodies.count else { return nil }
            defer { state.next += 1 }
            return state.next
        }) {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: bodies[index].body))
            guard let response = try? await http.execute(request, timeout: .seconds(70)),
                let body = try? await response.body.collect(upTo: 1 << 16)
            else { continue }
            if response.status == .ok, String(buffer: body).contains(#""status":"accepted""#) {
                let at = ContinuousClock.now
                state.withLock { $0.acknowledged.append((bodies[index].jti, at)) }
            } else {
                // 503 while no host takes writes: the sender waits a little, as Apple retries.
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    func stop() { state.withLock { $0.stopped = true } }

    var count: Int { state.withLock { $0.acknowledged.count } }

    var acknowledgedJTIs: Set<String> { Set(state.withLock { $0.acknowledged.map(\.jti) }) }

    func acknowledgedJTIs(after instant: ContinuousClock.Instant) -> Set<String> {
        Set(state.withLock { $0.acknowledged.filter { $0.at > instant }.map(\.jti) })
    }

    func acknowledged(atLeast count: Int, within limit: Duration) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if self.count >= count { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return self.count >= count
    }

    /// When the first 200 after `instant` came.
    func firstAcknowledged(after instant: ContinuousClock.Instant, within limit: Duration) async -> ContinuousClock.Instant? {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if let first = state.withLock({ $0.acknowledged.first { $0.at > instant }?.at }) { return first }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }
}

/// A COMMIT whose outcome the service cannot know.
@Suite("Commit outcome unknown", .timeLimit(.minutes(10)))
struct CommitOutcomeTests {
    @Test("The connection cut right after COMMIT went out: 503, never 200; Apple's retry of the same notification is stored once")
    func cutAfterCommit() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        let components = try #require(URLComponents(string: databaseURL))
        let socket = try #require(components.queryItems?.first { $0.name == "host" }?.value) + "/.s.PGSQL.5432"
        let host = TCPProxy(target: socket)
        let port = try await host.start()
        let url = "postgres://\(components.user ?? "")@127.0.0.1:\(port)\(components.path)?sslmode=disable"
        let serving = try await TestBinary.startServing(
            ["serve", "--role", "receiver"],
            environment: ["DATABASE_URL": url, "SIWA_EMBEDDED_DATABASE": "off", "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL],
            directory: keys.directory)
        defer { serving.process.signal(SIGKILL) }
        let (jti, body) = try #require(try keys.bodies(count: 1, prefix: "cut").first)
        func post() async throws -> (status: Int, body: String) {
            var request = HTTPClientRequest(url: "http://127.0.0.1:\(serving.port)/apple/notifications")
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(70))
            return (Int(response.status.code), String(buffer: try await response.body.collect(upTo: 1 << 16)))
        }

        host.cutAfterNextCommit()
        let cut = try await post()
        #expect(host.cuts == 1)
        #expect(cut.status == 503, "\(cut)")
        // The COMMIT reached the server: the notification is stored. Apple retries; the retry is
        // answered 200 and not stored twice.
        let retried = try await post()
        #expect(retried.status == 200, "\(retried)")
        let stored = try await TestBinary.withDatabase(databaseURL) { client in
            try await TestBinary.count(client, "SELECT count(*)::bigint FROM notifications WHERE jti = \(jti)")
        }
        #expect(stored == 1)
        serving.process.signal(SIGTERM)
        _ = await serving.process.waitForExit()
        await host.stop()
    }
}
