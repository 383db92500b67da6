import PostgresNIO
import Logging

/// A database error for logs: code, SQLSTATE and the server's message — never the query or its
/// bound values (`String(reflecting:)` of a PSQLError prints both, and they hold email addresses).
package func loggable(_ error: any Error) -> String {
    guard let error = error as? PSQLError else { return String(describing: error) }
    var parts = ["\(error.code)"]
    if let state = error.serverInfo?[.sqlState] { parts.append("sqlstate=\(state)") }
    if let message = error.serverInfo?[.message] { parts.append("message=\(message)") }
    if let underlying = error.underlying { parts.append("underlying=\(underlying)") }
    return parts.joined(separator: " ")
}

/// Whether the same statement may succeed later: a failure without SQLSTATE (connection, timeout,
/// pool) or of class 08 (connection), 40 (rollback), 53 (resources), 57 (operator intervention) or
/// 58 (system). Any other class (22 data, 23 constraint, 54 limit, …) is about the rows themselves:
/// retrying them fails again, so they are refused, never kept for retry.
package func canHeal(_ error: any Error) -> Bool {
    guard let state = sqlState(error) else { return true }
    return ["08", "40", "53", "57", "58"].contains(String(state.prefix(2)))
}

/// The SQLSTATE PostgreSQL answered with, if the failure came from the server.
package func sqlState(_ error: any Error) -> String? {
    (error as? PSQLError)?.serverInfo?[.sqlState]
}

extension PostgresClient {
    /// `withTransaction`, throwing what went wrong itself: the closure's error (a rolled-back
    /// transaction's cause, e.g. a domain error the caller maps), or BEGIN's or COMMIT's — not
    /// postgres-nio's wrapper around them.
    /// Internal: stores call `client.bounded.transaction` (see `BoundedPostgres`).
    func transaction<Result>(
        logger: Logger, _ body: (PostgresConnection) async throws -> sending Result
    ) async throws -> sending Result {
        do {
            return try await withTransaction(logger: logger, body)
        } catch let error as PostgresTransactionError {
            throw error.cause
        }
    }
}

extension PostgresTransactionError {
    /// What went wrong itself: the closure's error (a rolled-back transaction's cause), or BEGIN's
    /// or COMMIT's — not postgres-nio's wrapper around them.
    var cause: any Error { closureError ?? beginError ?? commitError ?? self }
}
