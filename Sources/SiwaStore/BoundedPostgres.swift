import Logging
import PostgresNIO
import SiwaDomain
import SiwaRuntime
import Synchronization

/// The PostgreSQL client as the stores use it (`client.bounded`): every call answers within
/// `limit`, and at once when its caller is cancelled.
///
/// postgres-nio 1.33 can drop a statement written to a connection the server is closing, and its
/// caller then waits forever. Each call runs in its own task (`withDeadline`), so a lost statement
/// strands only that task; the caller gets `DeadlineExceeded` and takes its usual error path.
/// The migrator keeps the raw client: an index build may legitimately run for minutes.
package struct BoundedPostgres: Sendable {
    /// Longer than any statement of ours runs (batches and prunes are bounded; the pool itself
    /// gives up on a lease after about a minute of the database being unreachable).
    package static let defaultLimit: Duration = .seconds(60)

    package let client: PostgresClient
    package let limit: Duration

    package init(client: PostgresClient, limit: Duration = BoundedPostgres.defaultLimit) {
        self.client = client
        self.limit = limit
    }

    @discardableResult
    package func query(_ query: PostgresQuery, logger: Logger) async throws -> PostgresRowSequence {
        if let shared = Self.shared {
            return try await withDeadline(limit) { try await shared.query(query, logger: logger) }
        }
        let client = self.client
        return try await withDeadline(limit) { try await client.query(query, logger: logger) }
    }

    /// The connection of a `readingTogether` scope: `query` (and `count`) in it run there.
    @TaskLocal static var shared: PostgresConnection?

    /// `body` with every `query` it makes through a `BoundedPostgres` (of any store) in one
    /// read-only transaction: a monitoring round's dozen reads cost the database one transaction
    /// instead of a dozen, and see one snapshot. A write in `body` fails (read-only); its own
    /// `transaction` or `withConnection` calls lease their own connection as usual.
    package func readingTogether<Result: Sendable>(logger: Logger, _ body: @escaping @Sendable () async throws -> Result) async throws -> Result {
        try await transaction(logger: logger) { connection in
            try await connection.query("SET TRANSACTION READ ONLY", logger: logger)
            return try await Self.$shared.withValue(connection) { try await body() }
        }
    }

    /// A statement whose one row is one count (`SELECT count(*)::bigint …`, typically over a
    /// data-modifying CTE): read to the end, so a statement's error, which arrives with its rows,
    /// is thrown here.
    package func count(_ query: PostgresQuery, logger: Logger) async throws -> Int {
        var count = 0
        for try await (n,) in try await self.query(query, logger: logger).decode((Int,).self) { count = n }
        return count
    }

    package func withConnection<Result: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> Result) async throws -> Result {
        let client = self.client
        return try await watched { watch in try await client.withConnection { connection in try await watch(connection) { try await body(connection) } } }
    }

    /// `PostgresClient.transaction` (the closure's own error, not postgres-nio's wrapper), bounded.
    package func transaction<Result: Sendable>(
        logger: Logger, _ body: @escaping @Sendable (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        let client = self.client
        return try await watched { watch in
            try await client.transaction(logger: logger) { connection in try await watch(connection) { try await body(connection) } }
        }
    }

    /// What `watched` hands its operation: runs a body on a connection, watched for its close.
    typealias Watch<Result: Sendable> = @Sendable (PostgresConnection, () async throws -> Result) async throws -> Result

    /// `operation` within `limit`, answered at once when its caller is cancelled (its task is then
    /// cancelled too) and, with `KeptConnection.ConnectionClosed`, when the connection its body
    /// runs on closes first (`ConnectionWatches`): a statement postgres-nio lost then costs the
    /// caller nothing, and the pooled connection's task ends with the call.
    private func watched<Result: Sendable>(_ operation: @escaping @Sendable (_ watch: Watch<Result>) async throws -> Result) async throws -> Result {
        let work = Mutex<Task<Void, Never>?>(nil)
        return try await withTaskCancellationHandler {
            try await withDeadline(limit, submit: { (completion: Completion<Result>) in
                let task = Task {
                    do {
                        let result = try await operation { connection, body in
                            let token = ConnectionWatches.shared.watch(connection) { completion(.failure(KeptConnection.ConnectionClosed())) }
                            defer { token.map(ConnectionWatches.shared.unwatch) }
                            return try await body()
                        }
                        completion(.success(result))
                    } catch {
                        completion(.failure(error))
                    }
                }
                work.withLock { $0 = task }
            })
        } onCancel: {
            work.withLock { $0 }?.cancel()
        }
    }
}

extension PostgresClient {
    /// This client with every call bounded in time and cancellable (see `BoundedPostgres`).
    package var bounded: BoundedPostgres { BoundedPostgres(client: self) }
}
