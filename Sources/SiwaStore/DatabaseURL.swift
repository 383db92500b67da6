import Foundation
import NIOSSL
import PostgresNIO
import SiwaDomain

/// `DATABASE_URL` → a `PostgresClient` configuration (and a single connection's, for `DatabaseProbe`).
///
/// Accepted: `postgres://user:password@host:port/database?sslmode=disable|prefer|require`; several
/// hosts, tried in order as libpq does (`postgres://u:p@h1:5432,h2:5432/db`), with
/// `target_session_attrs=any|read-write|primary`; and, for a unix socket,
/// `postgres://user@/database?host=/run/postgresql` (libpq's convention). TCP hosts are reached
/// through `DatabaseRelay` (host order, liveness); a socket directly.
package enum DatabaseURL {
    package struct InvalidURL: Error, CustomStringConvertible {
        package let description: String
    }

    /// What the URL names, parsed once for every use.
    package struct Target: Sendable {
        package enum Place: Sendable { case socket(String), hosts([DatabaseHost], tls: TLSMode) }
        package enum TLSMode: Sendable { case disable, prefer, require }
        package var place: Place
        package var username: String
        package var password: String?
        package var database: String?
        package var sessionAttributes: SessionAttributes = .any
    }

    /// libpq's `target_session_attrs`: which server a connection may stay on.
    package enum SessionAttributes: String, Sendable {
        case any
        /// A server that accepts writes: not a hot standby, `default_transaction_read_only` off.
        case readWrite = "read-write"
        /// Not a hot standby.
        case primary
    }

    package static func target(_ text: String) throws(InvalidURL) -> Target {
        let (single, hosts) = try hostList(text)
        guard let components = URLComponents(string: single), let scheme = components.scheme,
            ["postgres", "postgresql"].contains(scheme)
        else {
            throw InvalidURL(description: "DATABASE_URL must look like postgres://user:password@host:5432/database (got \(redacted(text)))")
        }
        let query = Dictionary((components.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        let username = components.user.flatMap { $0.removingPercentEncoding } ?? "postgres"
        let password = components.password.flatMap { $0.removingPercentEncoding }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        let database = path.isEmpty ? nil : path.removingPercentEncoding
        guard let attributes = SessionAttributes(rawValue: query["target_session_attrs"] ?? "any") else {
            throw InvalidURL(
                description: "DATABASE_URL target_session_attrs \(query["target_session_attrs"] ?? "") is not supported; use any, read-write or primary")
        }
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
        let listed = hosts ?? [DatabaseHost(name: host, port: components.port ?? 5432)]
        return Target(
            place: .hosts(listed, tls: tls), username: username, password: password, database: database, sessionAttributes: attributes)
    }

    /// A URL naming several hosts (`h1:5432,h2`) as one naming the first (which URLComponents
    /// parses), and the hosts; nil hosts when there is one.
    static func hostList(_ text: String) throws(InvalidURL) -> (String, [DatabaseHost]?) {
        guard let schemeEnd = text.range(of: "://") else { return (text, nil) }
        let rest = text[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { "/?#".contains($0) } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        let hostsStart = authority.lastIndex(of: "@").map { authority.index(after: $0) } ?? authority.startIndex
        let list = authority[hostsStart...]
        guard list.contains(",") else { return (text, nil) }
        var hosts: [DatabaseHost] = []
        for entry in list.split(separator: ",", omittingEmptySubsequences: false) {
            guard let host = DatabaseHost(entry) else {
                throw InvalidURL(description: "DATABASE_URL lists a host it cannot read: '\(entry)'; list them as host:port,host:port")
            }
            hosts.append(host)
        }
        return (String(text[..<hostsStart]) + hosts[0].description + String(rest[authorityEnd...]), hosts)
    }

    /// A warning when the URL lets TLS be stripped: a host off this machine with `sslmode` unset or
    /// `prefer`/`allow`, which fall back to plain text when the server (or anyone on the path)
    /// declines TLS: credentials and data then cross the network readable and alterable.
    package static func transportWarning(_ text: String) -> String? {
        guard let target = try? target(text), case .hosts(let hosts, let mode) = target.place, mode == .prefer,
            let host = hosts.first(where: { !LoopbackHost.contains($0.name) })?.name
        else { return nil }
        let query = URLComponents(string: (try? hostList(text))?.0 ?? text)?.queryItems?.first { $0.name == "sslmode" }?.value
        return "DATABASE_URL reaches \(host) with sslmode=\(query ?? "prefer (the default)"): TLS is used only if offered, so anyone on the network path can downgrade the connection to plain text; add sslmode=require"
    }

    /// Each host's connection configuration, in order, giving up connecting after `connectTimeout`
    /// (a socket: one).
    package static func connectionConfigurations(_ text: String, connectTimeout: Duration) throws -> [PostgresConnection.Configuration] {
        let target = try target(text)
        var configurations: [PostgresConnection.Configuration]
        switch target.place {
        case .socket(let path):
            configurations = [.init(unixSocketPath: path, username: target.username, password: target.password, database: target.database)]
        case .hosts(let hosts, let mode):
            let tls: PostgresConnection.Configuration.TLS =
                switch mode {
                case .disable: .disable
                case .prefer: .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
                case .require: .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
                }
            configurations = hosts.map {
                .init(host: $0.name, port: $0.port, username: target.username, password: target.password, database: target.database, tls: tls)
            }
        }
        for index in configurations.indices { configurations[index].options.connectTimeout = .milliseconds(connectTimeout.milliseconds) }
        return configurations
    }

    /// The URL with its password masked, for messages and logs.
    package static func redacted(_ text: String) -> String {
        if let (single, hosts) = try? hostList(text), let hosts {
            var masked = redacted(single)
            if let first = masked.range(of: hosts[0].description) {
                masked.replaceSubrange(first, with: hosts.map(\.description).joined(separator: ","))
            }
            return masked
        }
        guard var components = URLComponents(string: text), components.password != nil else { return text }
        components.password = "***"
        return components.string ?? "(unparseable)"
    }
}

/// One host of `DATABASE_URL`.
package struct DatabaseHost: Sendable, Hashable, CustomStringConvertible {
    package let name: String
    package let port: Int

    package init(name: String, port: Int) {
        self.name = name
        self.port = port
    }

    /// `host`, `host:port`, `[v6]` or `[v6]:port`.
    init?(_ text: Substring) {
        var rest = text
        let name: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            name = rest[rest.index(after: rest.startIndex)..<close]
            rest = rest[rest.index(after: close)...]
        } else {
            let colon = rest.firstIndex(of: ":") ?? rest.endIndex
            name = rest[..<colon]
            rest = rest[colon...]
        }
        guard !name.isEmpty, name.allSatisfy({ $0.isLetter || $0.isNumber || ".-_:".contains($0) }) else { return nil }
        var port = 5432
        if !rest.isEmpty {
            guard rest.hasPrefix(":"), let number = Int(rest.dropFirst()), (1...65535).contains(number) else { return nil }
            port = number
        }
        self.init(name: String(name), port: port)
    }

    package var description: String { name.contains(":") ? "[\(name)]:\(port)" : "\(name):\(port)" }
}
