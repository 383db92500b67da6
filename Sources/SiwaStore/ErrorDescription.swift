import PostgresNIO

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

/// SQLSTATE class 22 (data exception): the row itself is unacceptable, retrying won't help.
package func isDataException(_ error: any Error) -> Bool {
    (error as? PSQLError)?.serverInfo?[.sqlState]?.hasPrefix("22") == true
}
