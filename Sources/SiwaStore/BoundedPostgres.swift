import Logging
import PostgresNIO
import SiwaDomain
import SiwaRuntime

/// The PostgreSQL client as the stores use it (`client.bounded`): every call answers within
/// `limit`, and at once when its caller is cancelled.
///
/// Why: postgres-nio 1.33 can lose a statement. When the server closes connections (a restart, a
/// failover, `pg_terminate_backend`), the pool may lease one it has not yet seen close; a
/// statement written to it after NIO removed the connection's handlers is dropped without failing
/// its promise (the write's own promise is `nil`), and the caller waits forever, deaf to
/// cancellation. Seen: after `pg_ctl stop -m fast` one or two effect workers (claiming at that
/// instant) never came back; the process kept serving with fewer workers, and SIGTERM ended in
/// ServiceLifecycle's fatal "Cancellation took longer than allowed" — reproduced 3 times in 25
/// restarts on a loaded machine, traced to the claim statement.
///
/// Each call runs in its own task (`withDeadline`): a lost statement strands only that task and a
/// lease on a connection the pool has already dropped; its caller gets `DeadlineExceeded` and
/// takes its usual error path (a worker retries, a request answers 503). `query` bounds the
/// statement until its first answer; its rows then stream as usual (a closing connection fails
/// them). The migrator keeps the raw client: an index build may legitimately run for minutes.
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
        let client = self.client
        return try await withDeadline(limit) { try await client.query(query, logger: logger) }
    }

    package func withConnection<Result: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> Result) async throws -> Result {
        let client = self.client
        return try await withDeadline(limit) { try await client.withConnection(body) }
    }

    /// `PostgresClient.transaction` (the closure's own error, not postgres-nio's wrapper), bounded.
    package func transaction<Result: Sendable>(
        logger: Logger, _ body: @escaping @Sendable (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        let client = self.client
        return try await withDeadline(limit) { try await client.transaction(logger: logger) { connection in try await body(connection) } }
    }
}

extension PostgresClient {
    /// This client with every call bounded in time and cancellable (see `BoundedPostgres`).
    package var bounded: BoundedPostgres { BoundedPostgres(client: self) }
}
