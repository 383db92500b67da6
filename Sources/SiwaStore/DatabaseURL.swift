import Foundation
import NIOSSL
import PostgresNIO
import SiwaDomain

/// `DATABASE_URL` → a `PostgresClient` configuration (and a single connection's, for `DatabaseProbe`).
///
/// Accepted: `postgres://user:password@host:port/database?sslmode=disable|prefer|require` and, for a
/// unix socket, `postgres://user@/database?host=/run/postgresql` (libpq's convention).
package enum DatabaseURL {
    package struct InvalidURL: Error, CustomStringConvertible {
        package let description: String
    }

    /// What the URL names, parsed once for both configurations.
    struct Target {
        enum Place { case socket(String), host(String, port: Int, tls: TLSMode) }
        enum TLSMode { case disable, prefer, require }
        var place: Place
        var username: String
        var password: String?
        var database: String?
    }

    static func target(_ text: String) throws(InvalidURL) -> Target {
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
            return Target(place: .socket("\(socketDirectory)/.s.PGSQL.\(port)"), username: username, password: password, database: database)
        }
        guard let host = components.host, !host.isEmpty else {
            throw InvalidURL(description: "DATABASE_URL has no host (got \(redacted(text)))")
        }
        let tls: Target.TLSMode
        switch query["sslmode"] ?? "prefer" {
        case "disable": tls = .disable
        case "prefer", "allow": tls = .prefer
        case "require", "verify-ca", "verify-full": tls = .require
        case let other:
            throw InvalidURL(description: "DATABASE_URL sslmode \(other) is not supported; use disable, prefer or require")
        }
        return Target(place: .host(host, port: components.port ?? 5432, tls: tls), username: username, password: password, database: database)
    }

    /// A warning when the URL lets TLS be stripped: a host off this machine with `sslmode` unset or
    /// `prefer`/`allow`, which fall back to plain text when the server (or anyone on the path)
    /// declines TLS: credentials and data then cross the network readable and alterable.
    package static func transportWarning(_ text: String) -> String? {
        guard let target = try? target(text), case .host(let host, _, let mode) = target.place, mode == .prefer else { return nil }
        if LoopbackHost.contains(host) { return nil }
        let query = URLComponents(string: text)?.queryItems?.first { $0.name == "sslmode" }?.value
        return "DATABASE_URL reaches \(host) with sslmode=\(query ?? "prefer (the default)"): TLS is used only if offered, so anyone on the network path can downgrade the connection to plain text; add sslmode=require"
    }

    package static func configuration(_ text: String) throws(InvalidURL) -> PostgresClient.Configuration {
        let target = try target(text)
        switch target.place {
        case .socket(let path):
            return .init(unixSocketPath: path, username: target.username, password: target.password, database: target.database)
        case .host(let host, let port, let mode):
            let tls: PostgresClient.Configuration.TLS =
                switch mode {
                case .disable: .disable
                case .prefer: .prefer(.makeClientConfiguration())
                case .require: .require(.makeClientConfiguration())
                }
            return .init(host: host, port: port, username: target.username, password: target.password, database: target.database, tls: tls)
        }
    }

    /// One connection's configuration, giving up connecting after `connectTimeout`.
    package static func connectionConfiguration(_ text: String, connectTimeout: Duration) throws -> PostgresConnection.Configuration {
        let target = try target(text)
        var configuration: PostgresConnection.Configuration
        switch target.place {
        case .socket(let path):
            configuration = .init(unixSocketPath: path, username: target.username, password: target.password, database: target.database)
        case .host(let host, let port, let mode):
            let tls: PostgresConnection.Configuration.TLS =
                switch mode {
                case .disable: .disable
                case .prefer: .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
                case .require: .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
                }
            configuration = .init(host: host, port: port, username: target.username, password: target.password, database: target.database, tls: tls)
        }
        configuration.options.connectTimeout = .milliseconds(connectTimeout.milliseconds)
        return configuration
    }

    /// The URL with its password masked, for messages and logs.
    package static func redacted(_ text: String) -> String {
        guard var components = URLComponents(string: text), components.password != nil else { return text }
        components.password = "***"
        return components.string ?? "(unparseable)"
    }
}
