import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Where everything of one embedded cluster lives, derived from the data directory alone so
/// that every process (server, CLI, tests) computes the same paths.
///
///     <dataDirectory>/pgdata          the cluster (0700, owned by the cluster's OS user)
///     <dataDirectory>/pgdata.initdb   staging area while initdb runs, renamed to pgdata when done
///     <dataDirectory>/run             the socket directory (0700), when its path is short enough
///     <dataDirectory>/postgres.log    the server log
///     <dataDirectory>/.lock           flock(2) serialising start/stop between processes
struct ClusterLayout: Sendable, Equatable {
    /// Absolute and standardized, so relative paths and `..` from different working
    /// directories name the same cluster (and hash to the same fallback socket directory).
    let dataDirectory: String
    let socketDirectory: String

    var pgdata: String { "\(dataDirectory)/pgdata" }
    var stagingDirectory: String { "\(dataDirectory)/pgdata.initdb" }
    var logFile: String { "\(dataDirectory)/postgres.log" }
    var lockFile: String { "\(dataDirectory)/.lock" }
    var postmasterPidFile: String { "\(pgdata)/postmaster.pid" }
    var versionFile: String { "\(pgdata)/PG_VERSION" }

    /// Unix socket paths are limited to 107 bytes (sun_path); keep a margin.
    static let maximumSocketPathLength = 100

    init(dataDirectory: String, port: Int) throws {
        let absolute = Self.absoluteStandardized(dataDirectory)
        try Self.validate(absolute)
        self.dataDirectory = absolute
        self.socketDirectory = Self.socketDirectory(for: absolute, port: port)
    }

    static func absoluteStandardized(_ path: String) -> String {
        let base = URL(fileURLWithPath: FileManager.default.currentDirectoryPath, isDirectory: true)
        var standardized = URL(fileURLWithPath: path, relativeTo: base).standardizedFileURL.path
        while standardized.count > 1 && standardized.hasSuffix("/") { standardized.removeLast() }
        return standardized
    }

    /// `pg_ctl` pastes the data directory and log path into a `/bin/sh -c` command line inside
    /// double quotes, where these characters would be interpreted rather than taken literally.
    private static func validate(_ path: String) throws {
        let forbidden: Set<Character> = ["\"", "$", "`", "\\"]
        if let bad = path.first(where: { forbidden.contains($0) || $0.isNewline || $0.asciiValue.map { $0 < 0x20 } == true }) {
            throw EmbeddedPostgresError.unsupportedDataDirectory(
                path: path, reason: "it contains \(bad.debugDescription), which pg_ctl cannot pass to the server safely")
        }
    }

    /// `<dataDirectory>/run` when the socket path fits; otherwise a short per-cluster directory
    /// in /tmp named by a stable hash of the data directory, so each cluster keeps its own.
    static func socketDirectory(for dataDirectory: String, port: Int) -> String {
        let preferred = "\(dataDirectory)/run"
        if "\(preferred)/.s.PGSQL.\(port)".utf8.count <= maximumSocketPathLength {
            return preferred
        }
        return "/tmp/siwa-pg-\(stableHash(dataDirectory))"
    }

    /// 12 hex digits of 64-bit FNV-1a: stable across processes and releases (unlike `Hasher`).
    static func stableHash(_ text: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String((String(repeating: "0", count: max(0, 16 - hex.count)) + hex).prefix(12))
    }
}

// MARK: - File-system helpers

enum FileSystem {
    static func exists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }

    static func isEmptyDirectory(_ path: String) -> Bool {
        (try? FileManager.default.contentsOfDirectory(atPath: path))?.isEmpty ?? false
    }

    static func readText(_ path: String) -> String? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return String(decoding: data, as: UTF8.self)
    }

    static func errorText() -> String { String(cString: strerror(errno)) }

    /// `mkdir -p` where each directory we create gets 0755 regardless of umask: with a 077 umask
    /// (common for root) the cluster's account could not traverse what we just made.
    /// Directories that already exist are left exactly as they are.
    static func createDirectoryTree(_ path: String) throws {
        var prefix = ""
        for component in path.split(separator: "/") {
            prefix += "/\(component)"
            if mkdir(prefix, 0o755) == 0 {
                guard chmod(prefix, 0o755) == 0 else {
                    throw EmbeddedPostgresError.fileSystem(operation: "set permissions on", path: prefix, reason: errorText())
                }
            } else if errno != EEXIST {
                throw EmbeddedPostgresError.fileSystem(operation: "create the directory", path: prefix, reason: errorText())
            }
        }
    }

    /// The socket directory, private to `account` (0700): created if missing; refused if it is
    /// a symlink, not a directory, or owned by anyone but the account (or by root, when we are
    /// root and about to hand it over). It may live in world-writable /tmp, where someone else
    /// could have created it first. Re-checked on every start: /tmp may be cleaned meanwhile.
    static func prepareSocketDirectory(_ path: String, for account: ClusterAccount) throws {
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            throw EmbeddedPostgresError.fileSystem(operation: "create the directory", path: path, reason: errorText())
        }
        var info = stat()
        guard lstat(path, &info) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "inspect", path: path, reason: errorText())
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw EmbeddedPostgresError.unsafeSocketDirectory(path: path, reason: "it is not a directory (or is a symlink)")
        }
        let ownerIsAcceptable = info.st_uid == account.uid || (ClusterAccount.isRoot && info.st_uid == 0)
        guard ownerIsAcceptable else {
            throw EmbeddedPostgresError.unsafeSocketDirectory(
                path: path, reason: "it belongs to uid \(info.st_uid), not to \(account.name)")
        }
        try account.takeOwnership(of: path)
        guard chmod(path, 0o700) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "set permissions on", path: path, reason: errorText())
        }
    }

    /// Creates `path` (0600) if missing and hands it to the account, so the server can append to
    /// it even though it lives in a directory the account cannot write to.
    static func prepareAccountFile(_ path: String, for account: ClusterAccount) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "create", path: path, reason: errorText())
        }
        close(fd)
        try account.takeOwnership(of: path)
    }

    /// Replaces `path` atomically (temp file + rename) with `contents`, owned by the account.
    static func writeAccountFile(_ path: String, contents: String, for account: ClusterAccount) throws {
        let temporary = "\(path).siwa-tmp"
        do {
            try Data(contents.utf8).write(to: URL(fileURLWithPath: temporary))
        } catch {
            throw EmbeddedPostgresError.fileSystem(operation: "write", path: temporary, reason: "\(error)")
        }
        guard chmod(temporary, 0o600) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "set permissions on", path: temporary, reason: errorText())
        }
        try account.takeOwnership(of: temporary)
        guard rename(temporary, path) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "replace", path: path, reason: errorText())
        }
    }

    /// Appends to a file, keeping its owner and mode (used on files initdb made for the account).
    static func append(_ text: String, to path: String) throws {
        guard let handle = FileHandle(forWritingAtPath: path) else {
            throw EmbeddedPostgresError.fileSystem(operation: "open", path: path, reason: errorText())
        }
        defer { try? handle.close() }
        do {
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(text.utf8))
        } catch {
            throw EmbeddedPostgresError.fileSystem(operation: "append to", path: path, reason: "\(error)")
        }
    }

    /// Makes a rename durable: fsync the directory that holds the new name.
    static func syncDirectory(_ path: String) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = fsync(fd)
        close(fd)
    }

    /// The last `count` lines of a (possibly large) text file; reads only its final 64 KiB.
    static func tail(_ path: String, lines count: Int) -> String {
        guard let handle = FileHandle(forReadingAtPath: path) else { return "(\(path) could not be read)" }
        defer { try? handle.close() }
        let size = (try? handle.seekToEnd()) ?? 0
        let window: UInt64 = 64 * 1024
        try? handle.seek(toOffset: size > window ? size - window : 0)
        let text = String(decoding: (try? handle.readToEnd()) ?? Data(), as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        let tail = lines.suffix(count + 1).joined(separator: "\n").trimmingCharacters(in: .whitespacesAndNewlines)
        return tail.isEmpty ? "(the log is empty)" : tail
    }
}

/// An exclusive flock(2) on `<dataDirectory>/.lock`, held while one process runs the
/// status → initdb/start → create-database sequence, so that a second process arriving at the
/// same time waits and then finds the server running and attaches instead of starting another.
/// The kernel drops the lock when the descriptor closes or the process dies: a crash never
/// leaves it stuck. The descriptor is close-on-exec so the postmaster cannot inherit it.
/// (Separate open() calls conflict even within one process, so two `EmbeddedPostgres` values
/// in the same test process are serialised too.)
enum StartLock {
    static func withLock<T>(
        _ path: String,
        onWait: () -> Void,
        _ body: () async throws -> T
    ) async throws -> T {
        let descriptor = try await acquire(path, onWait: onWait)
        defer { close(descriptor) }
        return try await body()
    }

    /// Polls instead of blocking in flock(), which would tie up a cooperative-pool thread.
    private static func acquire(_ path: String, onWait: () -> Void) async throws -> Int32 {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "open the lock file", path: path, reason: FileSystem.errorText())
        }
        var waited = false
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR else {
                let reason = FileSystem.errorText()
                close(fd)
                throw EmbeddedPostgresError.fileSystem(operation: "lock", path: path, reason: reason)
            }
            if !waited {
                waited = true
                onWait()
            }
            do {
                try await Task.sleep(for: .milliseconds(100))
            } catch {
                close(fd)
                throw error
            }
        }
        return fd
    }
}
