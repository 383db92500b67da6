import Logging
import PostgresNIO
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import Testing

/// `KeptConnection`: the group committer's slots, the effect workers and the jobs notifier keep a
/// pool connection while their calls keep coming, instead of leasing one per call.
@Suite("A kept connection")
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
            let kept = KeptConnection(client: client, linger: .milliseconds(50))
            let keptBackend = try await kept.withConnection { try await Self.backend($0) }
            // The pool's only connection: leasable only once the keeper has given it back.
            let leased = try await withDeadline(.seconds(60)) { try await client.withConnection { try await Self.backend($0) } }
            #expect(leased == keptBackend)
            #expect(try await kept.withConnection { try await Self.backend($0) } == keptBackend, "leased again after its linger")
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

    @Test("a call past its limit is answered at the limit, and the next call runs at once on another connection")
    func stuckCallLeavesItsConnection() async throws {
        try await Self.withClient(maximumConnections: 3) { client in
            let (locked, lockedIn) = AsyncStream<Void>.makeStream()
            let (release, releaseIn) = AsyncStream<Void>.makeStream()
            // Another session holds advisory lock 42 until told.
            let holder = Task {
                try await client.withConnection { connection in
                    _ = try await connection.query("SELECT pg_advisory_lock(42)", logger: Self.logger)
                    lockedIn.yield()
                    for await _ in release { break }
                    _ = try await connection.query("SELECT pg_advisory_unlock(42)", logger: Self.logger)
                }
            }
            for await _ in locked { break }
            let kept = KeptConnection(client: client, limit: .milliseconds(300))
            let stuckBackend = try await kept.withConnection { try await Self.backend($0) }
            await #expect(throws: DeadlineExceeded.self) {
                try await kept.withConnection { _ = try await $0.query("SELECT pg_advisory_lock(42)", logger: Self.logger) }
            }
            let next = try await kept.withConnection { try await Self.backend($0) }
            #expect(next != stuckBackend)
            releaseIn.yield()
            try await holder.value
            kept.close()
        }
    }
}
