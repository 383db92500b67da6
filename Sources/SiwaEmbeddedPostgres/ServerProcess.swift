import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a running postmaster wrote into postmaster.pid: the facts an attaching process needs.
struct Postmaster: Sendable, Equatable {
    var pid: Int32
    var port: Int
    var socketDirectory: String
    /// "starting", "stopping", "ready" or "standby" (PostgreSQL pads these with spaces).
    var status: String

    /// Line layout (PostgreSQL ≥ 10): pid, data directory, start time, port, first socket
    /// directory, first listen address, shared memory key, status.
    init?(pidFile: String) {
        guard let text = FileSystem.readText(pidFile) else { return nil }
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        guard lines.count >= 5, let pid = Int32(lines[0]), let port = Int(lines[3]) else { return nil }
        self.pid = pid
        self.port = port
        self.socketDirectory = lines[4]
        self.status = lines.count >= 8 ? lines[7] : ""
    }

    var isReady: Bool { status == "ready" || status == "standby" }

    /// The name of the process now holding `pid` when that is not PostgreSQL, else nil.
    var unrelatedProcessName: String? {
        guard let name = FileSystem.readText("/proc/\(pid)/comm")?.trimmingCharacters(in: .whitespacesAndNewlines)
        else { return nil }
        return name.hasPrefix("postgres") || name.hasPrefix("postmaster") ? nil : name
    }
}

/// The server settings passed with `-c` on every start: they override postgresql.conf and
/// `ALTER SYSTEM`, so changing the options (or the socket directory) takes effect on the next
/// start, and nothing inside the database can re-open TCP or turn durability off.
struct ServerSettings: Sendable {
    var values: [(name: String, value: String)]

    /// Settings EmbeddedPostgres decides itself, with why an extra setting may not change them.
    static let managed: [String: String] = [
        "listen_addresses": "the embedded cluster only listens on its private unix socket",
        "unix_socket_directories": "the socket directory is derived from the data directory",
        "unix_socket_permissions": "the socket must stay private to the cluster's OS user",
        "unix_socket_group": "the socket must stay private to the cluster's OS user",
        "port": "the port is fixed (it only names the socket file)",
        "fsync": "durability is chosen with the `durable` option",
        "synchronous_commit": "durability is chosen with the `durable` option",
        "full_page_writes": "durability is chosen with the `durable` option",
        "data_directory": "the data directory is chosen with the `dataDirectory` option",
        "config_file": "the configuration lives in the data directory",
        "hba_file": "pg_hba.conf is managed by EmbeddedPostgres",
        "ident_file": "pg_hba.conf is managed by EmbeddedPostgres",
    ]

    init(socketDirectory: String, port: Int, durable: Bool, extra: [String: String]) throws {
        let onOff = durable ? "on" : "off"
        // unix_socket_directories is a list: double quotes keep a path with commas in one piece.
        let quotedSocketDirectory = "\"\(socketDirectory.replacingOccurrences(of: "\"", with: "\"\""))\""
        var values: [(name: String, value: String)] = [
            ("listen_addresses", ""),
            ("unix_socket_directories", quotedSocketDirectory),
            ("unix_socket_permissions", "0700"),
            ("port", "\(port)"),
            ("fsync", onOff),
            ("synchronous_commit", onOff),
            ("full_page_writes", onOff),
        ]
        for (name, value) in extra.sorted(by: { $0.key < $1.key }) {
            if let reason = Self.managed[name.lowercased()] {
                throw EmbeddedPostgresError.invalidSetting(name: name, reason: reason)
            }
            guard Self.isSettingName(name) else {
                throw EmbeddedPostgresError.invalidSetting(name: name, reason: "it is not a valid setting name")
            }
            values.append((name, value))
        }
        self.values = values
    }

    private static func isSettingName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || (first.isASCII && first.properties.isAlphabetic)
        else { return false }
        return name.unicodeScalars.allSatisfy { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == ".") }
    }

    /// The `pg_ctl -o` string. pg_ctl hands it to `/bin/sh -c`, so each `name=value` is
    /// single-quoted for the shell.
    var commandLineOptions: String {
        values.map { "-c \(Self.shellQuoted("\($0.name)=\($0.value)"))" }.joined(separator: " ")
    }

    static func shellQuoted(_ text: String) -> String {
        "'\(text.replacingOccurrences(of: "'", with: "'\\''"))'"
    }
}
