import Foundation

/// The installed PostgreSQL tools we drive, all taken from one bin directory so they match.
struct PostgresBinaries: Sendable {
    enum Tool: String, CaseIterable {
        case initdb
        case pgCtl = "pg_ctl"
        case postgres
        case psql
        case createdb
        case pgBasebackup = "pg_basebackup"
    }

    let directory: String

    func path(_ tool: Tool) -> String { "\(directory)/\(tool.rawValue)" }

    /// Finds the bin directory: the explicit option (the app's `SIWA_POSTGRES_BIN` setting), else
    /// the variable itself (test clusters, which have no Configuration), else the newest
    /// `/usr/lib/postgresql/*/bin` (Debian's layout), else wherever `initdb` is on `PATH`.
    /// An explicit choice is never silently replaced by another installation.
    static func locate(explicit: String?, environment: [String: String]) throws -> PostgresBinaries {
        if let explicit {
            return try verified(explicit, searched: ["SIWA_POSTGRES_BIN=\(explicit)"])
        }
        if let fromEnvironment = environment["SIWA_POSTGRES_BIN"], !fromEnvironment.isEmpty {
            return try verified(fromEnvironment, searched: ["SIWA_POSTGRES_BIN=\(fromEnvironment)"])
        }
        let searched = ["SIWA_POSTGRES_BIN", "/usr/lib/postgresql/*/bin", "PATH"]
        if let debian = newestDebianBinDirectory() {
            return try verified(debian, searched: searched)
        }
        if let onPath = directoryOfInitdbOnPath(environment["PATH"] ?? "") {
            return try verified(onPath, searched: searched)
        }
        throw EmbeddedPostgresError.binariesNotFound(searched: searched)
    }

    /// `initdb` decides whether a directory counts at all; the other tools must then be beside it.
    private static func verified(_ directory: String, searched: [String]) throws -> PostgresBinaries {
        let directory = directory.count > 1 && directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        guard isExecutable("\(directory)/\(Tool.initdb.rawValue)") else {
            throw EmbeddedPostgresError.binariesNotFound(searched: searched)
        }
        let missing = Tool.allCases.map(\.rawValue).filter { !isExecutable("\(directory)/\($0)") }
        guard missing.isEmpty else {
            throw EmbeddedPostgresError.incompleteBinaries(directory: directory, missing: missing)
        }
        return PostgresBinaries(directory: directory)
    }

    private static func newestDebianBinDirectory() -> String? {
        let root = "/usr/lib/postgresql"
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []
        return versions
            .filter { isExecutable("\(root)/\($0)/bin/initdb") }
            .max { versionKey($0).lexicographicallyPrecedes(versionKey($1)) }
            .map { "\(root)/\($0)/bin" }
    }

    /// "9.6" < "10" < "15": compare numerically, component by component.
    private static func versionKey(_ name: String) -> [Int] {
        name.split(separator: ".").map { Int($0) ?? -1 }
    }

    private static func directoryOfInitdbOnPath(_ path: String) -> String? {
        for entry in path.split(separator: ":") where !entry.isEmpty {
            let candidate = "\(entry)/initdb"
            if isExecutable(candidate) {
                // Follow a symlink (e.g. /usr/local/bin/initdb → …/bin/initdb) to the real bin directory.
                let resolved = URL(fileURLWithPath: candidate).resolvingSymlinksInPath().path
                return (resolved as NSString).deletingLastPathComponent
            }
        }
        return nil
    }

    private static func isExecutable(_ path: String) -> Bool {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
            && !isDirectory.boolValue
            && FileManager.default.isExecutableFile(atPath: path)
    }

    /// The major version as PostgreSQL writes it into `PG_VERSION` ("15", or "9.6" before 10),
    /// parsed from e.g. "pg_ctl (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)".
    static func majorVersion(fromVersionOutput output: String) -> String? {
        guard let range = output.range(of: "(PostgreSQL) ") else { return nil }
        let number = output[range.upperBound...].prefix { $0.isNumber || $0 == "." }
        let parts = number.split(separator: ".")
        guard let first = parts.first, let major = Int(first) else { return nil }
        if major >= 10 { return String(major) }
        return parts.count >= 2 ? "\(major).\(parts[1])" : nil
    }
}
