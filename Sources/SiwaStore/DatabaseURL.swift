import Foundation
import PostgresNIO

/// `DATABASE_URL` → a `PostgresClient` configuration.
///
/// Accepted: `postgres://user:password@host:port/database?sslmode=disable|prefer|require` and, for a
/// unix socket, `postgres://user@/database?host=/run/postgresql` (libpq's convention).
package enum DatabaseURL {
    package struct InvalidURL: Error, CustomStringConvertible {
        package let description: String
    }

    package static func configuration(_ text: String) throws(InvalidURL) -> PostgresClient.Configuration {
        guard let components = URLComponents(string: text), let scheme = components.scheme,
            ["postgres", "postgresql"].contains(scheme)
        else {
            throw InvalidURL(description: "DATABASE_URL must look like postgres://user:password@host:5432/database (got \(redacted(text)))")
        }
        let query = Dictionary((components.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        let username = components.user.flatMap { $0.removingPercentEncoding } ?? "postgres"
        let password = components.password.flatMap { $0.removingPercentEncoding }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        let database = path.isEmpty ? nil : path.removingPercentEncoding
        if let socketDirectory = query["host"], socketDirectory.hasPrefix("/") {
            let port = components.port ?? 5432
            return .init(unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: username, password: password, database: database)
        }
        guard let host = components.host, !host.isEmpty else {
            throw InvalidURL(description: "DATABASE_URL has no host (got \(redacted(text)))")
        }
        let tls: PostgresClient.Configuration.TLS
        switch query["sslmode"] ?? "prefer" {
        case "disable": tls = .disable
        case "prefer", "allow": tls = .prefer(.makeClientConfiguration())
        case "require", "verify-ca", "verify-full": tls = .require(.makeClientConfiguration())
        case let other:
            throw InvalidURL(description: "DATABASE_URL sslmode \(other) is not supported; use disable, prefer or require")
        }
        return .init(host: host, port: components.port ?? 5432, username: username, password: password, database: database, tls: tls)
    }

    /// The URL with its password masked, for messages and logs.
    package static func redacted(_ text: String) -> String {
        guard var components = URLComponents(string: text), components.password != nil else { return text }
        components.password = "***"
        return components.string ?? "(unparseable)"
    }
}
