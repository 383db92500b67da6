import Logging
import PostgresNIO

/// The role a client connects as. A superuser bypasses every grant and can run programs on the
/// database host, so code that runs as the service's role (a SECURITY DEFINER function) must never
/// run as one: the service role should own its database and nothing more.
package struct ConnectedRole: Sendable, Equatable {
    package var name: String
    package var isSuperuser: Bool

    package init(name: String, isSuperuser: Bool) {
        self.name = name
        self.isSuperuser = isSuperuser
    }

    package static func read(_ client: PostgresClient, logger: Logger) async throws -> ConnectedRole {
        let rows = try await client.bounded.query(
            "SELECT current_user::text, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user", logger: logger)
        for try await (name, superuser) in rows.decode((String, Bool).self) { return ConnectedRole(name: name, isSuperuser: superuser) }
        return ConnectedRole(name: "?", isSuperuser: false)
    }

    /// The warning `serve` logs and `doctor` reports for a superuser, with the fix.
    package var superuserProblem: String? {
        guard isSuperuser else { return nil }
        return "connected to PostgreSQL as \(name), a superuser: code that runs as the service's role could read every database and run programs on the database host. Connect as a role that owns the database and is no superuser (docs/operations.md, \"The database role\")"
    }
}
