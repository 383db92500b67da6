import Logging
import PostgresNIO
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import Testing

/// `KeptConnection`: the group committer's slots, the effect workers and the jobs notifier keep a
/// pool connection while their calls keep coming, instead of leasing one per call.
@Suite("A kept connection", .timeLimit(.minutes(10)))
struct KeptConnectionTests {
    static let logger = Logger(label: "kept-connection-test", factory: { _ in SwiftLogNoOpLogHandler() })

    static func withClient(maximumConnections: Int, _ body: (PostgresClient) async throws -> Void) async throws {
        var configuration = try await TestCluster.shared.makeDatabase()
        configuration.options.maximumConnections = maximumConnections
        let client = PostgresClient(configuration: configuration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await body(client)
        }
    }

    static func backend(_ connection: PostgresConnection) async throws -> Int {
        for try await (pid,) in try await connection.query("SELECT pg_backend_pid()", logger: logger).decode((Int,).self) { return pid }
        return 0
    }

    @Test("calls in a row run on the connection it keeps, which a lease meanwhile does not get; quiet for its linger, it is the pool's again")
    func keptThenGivenBack() async throws {
        try await Self.withClient(maximumConnections: 2) { client in
            let kept = KeptConnection(client: client, linger: .seconds(3600))
            let first = try await kept.withConnection { try await Self.backend($0) }
            let other = try await client.withConnection { try await Self.backend($0) }
            let second = try await kept.withConnection { try await Self.backend($0) }
            #expect(first == second)
            #expect(other != first, "the pool lent another connection: the kept one was not in it")
            kept.close()
        }
        try await Self.withClient(maximumConnections: 1) { client in
            // The pool's only connection, kept: a lease waits until the keeper gives it back.
            let kept = KeptConnection(client: client, linger: .seconds(3600))
            let keptBackend = try await kept.withConnection { try await Self.backend($0) }
            await #expect(throws: DeadlineExceeded.self, "leased while kept") {
                try await withDeadline(.milliseconds(300)) { try await client.withConnection { _ in } }
            }
            kept.close()
            #expect(try await withDeadline(.seconds(60)) { try await client.withConnection { try await Self.backend($0) } } == keptBackend)

            // Given back by itself after `linger` without a call.
            let lingering = KeptConnection(client: client, linger: .milliseconds(200))
            _ = try await lingering.withConnection { try await Self.backend($0) }
            let asked = ContinuousClock.now
            _ = try await withDeadline(.seconds(60)) { try await client.withConnection { _ in } }
            #expect(ContinuousClock.now - asked >= .milliseconds(100), "given back before its linger")
        }
    }

    @Test("a transaction's error is the closure's own, and it rolled back")
    func transactionError() async throws {
        struct Refused: Error {}
        try await Self.withClient(maximumConnections: 2) { client in
            let kept = KeptConnection(client: client)
            try await kept.withConnection { _ = try await $0.query("CREATE TABLE kept_probe (n int)", logger: Self.logger) }
            await #expect(throws: Refused.self) {
                try await kept.transaction(logger: Self.logger) { connection in
                    _ = try await connection.query("INSERT INTO kept_probe VALUES (1)", logger: Self.logger)
                    throw Refused()
                }
            }
            try await kept.transaction(logger: Self.logger) { _ = try await $0.query("INSERT INTO kept_probe VALUES (2)", logger: Self.logger) }
            #expect(try await QueueTests.count(client, "SELECT sum(n)::bigint FROM kept_probe") == 2)
            kept.close()
        }
    }

    /// Another session holds advisory lock 42 until `release` is yielded.
    static func holdingLock(_ client: PostgresClient, _ body: () async throws -> Void) async throws {
        let (locked, lockedIn) = AsyncStream<Void>.makeStream()
        let (release, releaseIn) = AsyncStream<Void>.makeStream()
        let holder = Task {
            try await client.withConnection { connection in
                _ = try await connection.query("SELECT pg_advisory_lock(42)", logger: Self.logger)
                lockedIn.yield()
                for await _ in release { break }
                _ = try await connection.query("SELECT pg_advisory_unlock(42)", logger: Self.logger)
            }
        }
        for await _ in locked { break }
        try await body()
        releaseIn.yield()
        try await holder.value
    }

    @Test("a call past its limit is answered at the limit, and the next call runs on another connection")
    func stuckCallLeavesItsConnection() async throws {
        try await Self.withClient(maximumConnections: 3) { client in
            try await Self.holdingLock(client) {
                let kept = KeptConnection(client: client)
                let stuckBackend = try await kept.withConnection { try await Self.backend($0) }
                let asked = ContinuousClock.now
                await #expect(throws: DeadlineExceeded.self) {
                    try await kept.withConnection(limit: .milliseconds(300)) { _ = try await $0.query("SELECT pg_advisory_lock(42)", logger: Self.logger) }
                }
                #expect(ContinuousClock.now - asked >= .milliseconds(300))
                let next = try await kept.withConnection { try await Self.backend($0) }
                #expect(next != stuckBackend)
                kept.close()
            }
        }
    }

    @Test("a cancelled call is answered at once, and the next call runs on another connection")
    func cancelledCallLeavesItsConnection() async throws {
        try await Self.withClient(maximumConnections: 3) { client in
            try await Self.holdingLock(client) {
                let kept = KeptConnection(client: client)
                let stuckBackend = try await kept.withConnection { try await Self.backend($0) }
                let call = Task { try await kept.withConnection { _ = try await $0.query("SELECT pg_advisory_lock(42)", logger: Self.logger) } }
                // Until PostgreSQL shows the call waiting for the lock.
                try await withDeadline(.seconds(60)) {
                    while try await QueueTests.count(client, "SELECT count(*)::bigint FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") == 0 {}
                }
                call.cancel()
                await #expect(throws: CancellationError.self) { try await call.value }
                let next = try await kept.withConnection { try await Self.backend($0) }
                #expect(next != stuckBackend)
                kept.close()
            }
        }
    }

    @Test("a call whose connection closes under it is answered then, not at its limit, and the next call runs on another connection")
    func closedUnderACall() async throws {
        try await Self.withClient(maximumConnections: 3) { client in
            let kept = KeptConnection(client: client)
            // The call's answer never comes (as a statement postgres-nio drops on a closing
            // connection): only the connection's close can end it before its 60 s limit.
            let (started, startedIn) = AsyncStream<Int>.makeStream()
            let (never, neverIn) = AsyncStream<Void>.makeStream()
            defer { neverIn.finish() }
            let call = Task {
                try await kept.withConnection { connection in
                    startedIn.yield(try await Self.backend(connection))
                    for await _ in never {}
                }
            }
            var backend = 0
            for await pid in started { backend = pid; break }
            let closing = ContinuousClock.now
            try await client.withConnection { _ = try await $0.query("SELECT pg_terminate_backend(\(backend)::int)", logger: Self.logger) }
            await #expect(throws: KeptConnection.ConnectionClosed.self) { try await call.value }
            #expect(ContinuousClock.now - closing < .seconds(30), "answered at its limit, not when the connection closed")
            let next = try await kept.withConnection { try await Self.backend($0) }
            #expect(next != backend)
            kept.close()
        }
    }

    @Test("a bounded transaction whose connection closes under it is answered then, not at its limit; the pool serves the next call")
    func boundedTransactionClosedUnderIt() async throws {
        try await Self.withClient(maximumConnections: 3) { client in
            let (started, startedIn) = AsyncStream<Int>.makeStream()
            let (never, neverIn) = AsyncStream<Void>.makeStream()
            defer { neverIn.finish() }
            let call = Task {
                try await client.bounded.transaction(logger: Self.logger) { connection in
                    startedIn.yield(try await Self.backend(connection))
                    for await _ in never {}
                }
            }
            var backend = 0
            for await pid in started { backend = pid; break }
            let closing = ContinuousClock.now
            try await client.withConnection { _ = try await $0.query("SELECT pg_terminate_backend(\(backend)::int)", logger: Self.logger) }
            await #expect(throws: KeptConnection.ConnectionClosed.self) { try await call.value }
            #expect(ContinuousClock.now - closing < .seconds(30), "answered at its limit, not when the connection closed")
            let next = try await client.bounded.withConnection { try await Self.backend($0) }
            #expect(next != backend)
        }
    }
}
