import Foundation
import Logging
import PostgresNIO

package enum BackendGrantsError: Error, Sendable, CustomStringConvertible {
    case invalidRole(String)
    case unknownRole(String)

    package var description: String {
        switch self {
        case .invalidRole(let role): "--role \(role) is not a plain role name (lowercase letters, digits, _; at most 63)"
        case .unknownRole(let role): "role \(role) does not exist: create it first, e.g. CREATE ROLE \(role) LOGIN PASSWORD '…'"
        }
    }
}

/// Least privilege for a backend that shares the database instead of calling the API: exactly
/// what docs/integration.md's session SQL needs — create a session (aud, sub, expires_at, identity_issued_at), read sessions
/// and accounts, log a session out — and nothing else (no notifications, tokens, jobs, audit).
package struct BackendGrants: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    package static let statements = [
        "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM %I",
        "GRANT USAGE ON SCHEMA public TO %I",
        "GRANT SELECT, INSERT (aud, sub, expires_at, identity_issued_at), UPDATE (revoked_at, revoked_reason) ON sessions TO %I",
        "GRANT SELECT ON accounts TO %I",
    ]

    /// What `grant` did and what every role still holds through PUBLIC.
    package struct Outcome: Sendable {
        /// The statements run, in order.
        package var statements: [String]
        /// What PUBLIC (so the granted role too) still holds that could shadow our objects, each
        /// with the statement that takes it away; empty when nothing is left.
        package var publicPrivileges: [PublicPrivilege]
    }

    /// A privilege PUBLIC holds by default that a role could use to create objects of its own.
    package struct PublicPrivilege: Sendable, Equatable {
        /// `TEMPORARY` on the database, or `CREATE` on schema public (the default before PostgreSQL 15).
        package var privilege: String
        /// The statement an owner runs to revoke it.
        package var revoke: String
    }

    /// Applies the grants in one transaction; returns the statements run and what PUBLIC still has.
    package func grant(role: String) async throws -> Outcome {
        guard role.range(of: "^[a-z_][a-z0-9_]{0,62}$", options: .regularExpression) != nil else { throw BackendGrantsError.invalidRole(role) }
        let logger = self.logger
        return try await client.bounded.transaction(logger: logger) { connection in
            var exists = false
            for try await (_,) in try await connection.query("SELECT 1 FROM pg_roles WHERE rolname = \(role)", logger: logger).decode((Int,).self) {
                exists = true
            }
            guard exists else { throw BackendGrantsError.unknownRole(role) }
            var run: [String] = []
            let templates = ["GRANT CONNECT ON DATABASE %I TO %I"] + Self.statements
            for (index, template) in templates.enumerated() {
                // The server quotes the identifiers (format's %I); the role name is bound.
                let query: PostgresQuery =
                    index == 0
                    ? "SELECT format(\(template), current_database(), \(role)::text)" : "SELECT format(\(template), \(role)::text)"
                var sql = ""
                for try await (text,) in try await connection.query(query, logger: logger).decode((String,).self) { sql = text }
                try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger)
                run.append(sql)
            }
            var held: [PublicPrivilege] = []
            let query: PostgresQuery = """
                SELECT format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', d.datname)
                FROM pg_database d, aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a
                WHERE d.datname = current_database() AND a.grantee = 0 AND a.privilege_type = 'TEMPORARY'
                UNION ALL
                SELECT 'REVOKE CREATE ON SCHEMA public FROM PUBLIC'
                FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
                WHERE n.nspname = 'public' AND a.grantee = 0 AND a.privilege_type = 'CREATE'
                """
            for try await (revoke,) in try await connection.query(query, logger: logger).decode((String,).self) {
                held.append(PublicPrivilege(privilege: revoke.contains("TEMPORARY") ? "TEMPORARY on the database" : "CREATE on schema public", revoke: revoke))
            }
            return Outcome(statements: run, publicPrivileges: held)
        }
    }
}
