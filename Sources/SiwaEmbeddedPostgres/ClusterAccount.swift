import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The OS account PostgreSQL's processes run as.
///
/// `initdb`, `pg_ctl` and `postgres` refuse to run as root, so a root process hands them to an
/// unprivileged system account; anyone else simply runs them as themselves.
enum ClusterAccount: Sendable, Equatable {
    /// We are not root: every tool runs as us, directly.
    case currentUser(uid: uid_t, name: String)
    /// We are root: every tool runs through `setpriv` as this account.
    case systemUser(SystemUser)

    struct SystemUser: Sendable, Equatable {
        var name: String
        var uid: uid_t
        var gid: gid_t
        var home: String
    }

    /// Debian's postgresql package creates this account; we prefer it when present.
    static let debianAccountName = "postgres"
    /// Created (as a system account without home or shell) when no `postgres` account exists.
    static let fallbackAccountName = "siwa-postgres"

    static var isRoot: Bool { geteuid() == 0 }

    var uid: uid_t {
        switch self {
        case .currentUser(let uid, _): uid
        case .systemUser(let user): user.uid
        }
    }

    var name: String {
        switch self {
        case .currentUser(_, let name): name
        case .systemUser(let user): user.name
        }
    }

    /// The account for a cluster that already exists: whoever owns its files. As root this keeps
    /// working even if the preferred account changed since `initdb` (e.g. the `postgres` account
    /// appeared after we had created `siwa-postgres`).
    static func forExistingCluster(pgdata: String) throws -> ClusterAccount {
        var info = stat()
        guard stat(pgdata, &info) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "inspect", path: pgdata, reason: String(cString: strerror(errno)))
        }
        let owner = info.st_uid
        if !isRoot {
            let me = current()
            guard owner == me.uid else {
                throw EmbeddedPostgresError.clusterOwnedByAnotherUser(pgdata: pgdata, owner: describe(uid: owner), currentUser: me.name)
            }
            return me
        }
        guard owner != 0, let user = lookUp(uid: owner) else {
            throw EmbeddedPostgresError.clusterOwnerUnusable(pgdata: pgdata, owner: describe(uid: owner))
        }
        return .systemUser(user)
    }

    /// The account for a cluster about to be created: as root `postgres` if it exists, otherwise
    /// `siwa-postgres`, created on the spot.
    static func forNewCluster() async throws -> ClusterAccount {
        guard isRoot else { return current() }
        if let user = lookUp(name: debianAccountName) ?? lookUp(name: fallbackAccountName) {
            return .systemUser(user)
        }
        guard let useradd = findExecutable("useradd", in: ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]) else {
            throw EmbeddedPostgresError.clusterUserUnavailable(
                reason: "there is no \(debianAccountName) or \(fallbackAccountName) account and `useradd` is not installed")
        }
        let result = try await Subprocess.run(
            useradd,
            ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", fallbackAccountName],
            environment: ProcessInfo.processInfo.environment)
        // Another process may have created it in the meantime; the lookup decides.
        guard let user = lookUp(name: fallbackAccountName) else {
            throw EmbeddedPostgresError.clusterUserUnavailable(
                reason: "`useradd \(fallbackAccountName)` failed: \(result.combinedOutput)")
        }
        return .systemUser(user)
    }

    /// How to run `executable` as this account.
    func commandLine(_ executable: String, _ arguments: [String]) throws -> (executable: String, arguments: [String]) {
        switch self {
        case .currentUser:
            return (executable, arguments)
        case .systemUser(let user):
            guard let setpriv = Self.findExecutable("setpriv", in: ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]) else {
                throw EmbeddedPostgresError.clusterUserUnavailable(
                    reason: "`setpriv` (from util-linux) is needed to run PostgreSQL as \(user.name) but is not installed; "
                        + "install util-linux")
            }
            // setpriv execs directly (no PAM session, no shell); changing the real and effective
            // uid away from 0 also drops every capability.
            return (setpriv, ["--reuid=\(user.uid)", "--regid=\(user.gid)", "--init-groups", "--", executable] + arguments)
        }
    }

    /// What PostgreSQL's tools and server need of our environment, and nothing else: the search
    /// path, locale and time zone (never our secrets, e.g. `SIWA_*` or `DATABASE_URL`, nor `PG*`
    /// variables, which would silently redirect the tools), with identity variables matching the
    /// account.
    func environment(from base: [String: String]) -> [String: String] {
        var environment = base.filter { key, _ in
            Self.passedThrough.contains(key) || key.hasPrefix("LC_")
        }
        if case .systemUser(let user) = self {
            environment["HOME"] = user.home
            environment["USER"] = user.name
            environment["LOGNAME"] = user.name
        }
        return environment
    }

    static let passedThrough: Set<String> = ["PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "HOME", "USER", "LOGNAME"]

    /// Hands a file or directory we created (as root) to the account; nothing to do otherwise.
    func takeOwnership(of path: String) throws {
        guard case .systemUser(let user) = self else { return }
        guard chown(path, user.uid, user.gid) == 0 else {
            throw EmbeddedPostgresError.fileSystem(
                operation: "hand over to \(user.name)", path: path, reason: String(cString: strerror(errno)))
        }
    }

    /// Root can open anything, the account cannot: every existing directory from `/` down to
    /// the data directory (and to the socket directory's parent) must grant it search (x)
    /// permission, or PostgreSQL fails later with a confusing error. We only report the blocking
    /// directory; loosening permissions on someone's home is their decision.
    func checkCanReach(_ layout: ClusterLayout) throws {
        try checkCanReach(layout.dataDirectory, dataDirectory: layout.dataDirectory)
        try checkCanReach((layout.socketDirectory as NSString).deletingLastPathComponent, dataDirectory: layout.dataDirectory)
    }

    private func checkCanReach(_ path: String, dataDirectory: String) throws {
        guard case .systemUser(let user) = self else { return }
        let groups = Self.groups(of: user)
        var prefix = ""
        for component in [""] + path.split(separator: "/").map(String.init) {
            prefix = component.isEmpty ? "/" : (prefix == "/" ? "/\(component)" : "\(prefix)/\(component)")
            var info = stat()
            guard stat(prefix, &info) == 0 else { return } // does not exist yet: created by us later
            let mode = info.st_mode
            let allowed: Bool
            if info.st_uid == user.uid {
                allowed = mode & S_IXUSR != 0
            } else if groups.contains(info.st_gid) {
                allowed = mode & S_IXGRP != 0
            } else {
                allowed = mode & S_IXOTH != 0
            }
            guard allowed else {
                throw EmbeddedPostgresError.dataDirectoryUnreachable(
                    dataDirectory: dataDirectory, blockingDirectory: prefix, user: user.name)
            }
        }
    }

    // MARK: - Account database

    private static func current() -> ClusterAccount {
        let uid = geteuid()
        return .currentUser(uid: uid, name: lookUp(uid: uid)?.name ?? "uid \(uid)")
    }

    private static func describe(uid: uid_t) -> String {
        lookUp(uid: uid).map { "\($0.name) (uid \(uid))" } ?? "uid \(uid)"
    }

    private static func lookUp(name: String) -> SystemUser? {
        withPasswdEntry { getpwnam_r(name, &$0, $1, $2, &$3) }
    }

    private static func lookUp(uid: uid_t) -> SystemUser? {
        withPasswdEntry { getpwuid_r(uid, &$0, $1, $2, &$3) }
    }

    /// The reentrant getpw*_r calls, so concurrent lookups never share libc's static buffer.
    private static func withPasswdEntry(
        _ call: (inout passwd, UnsafeMutablePointer<CChar>, Int, inout UnsafeMutablePointer<passwd>?) -> Int32
    ) -> SystemUser? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16_384)
        let status = buffer.withUnsafeMutableBufferPointer { call(&entry, $0.baseAddress!, $0.count, &result) }
        guard status == 0, result != nil else { return nil }
        return SystemUser(
            name: String(cString: entry.pw_name),
            uid: entry.pw_uid,
            gid: entry.pw_gid,
            home: entry.pw_dir.map { String(cString: $0) } ?? "/")
    }

    private static func groups(of user: SystemUser) -> Set<gid_t> {
        var count: Int32 = 64
        var groups = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(user.name, user.gid, &groups, &count) == -1 {
            groups = [gid_t](repeating: 0, count: Int(count))
            _ = getgrouplist(user.name, user.gid, &groups, &count)
        }
        return Set(groups.prefix(Int(max(count, 0)))).union([user.gid])
    }

    static func findExecutable(_ name: String, in directories: [String]) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"]?.split(separator: ":").map(String.init) ?? []
        return (directories + path)
            .map { "\($0)/\(name)" }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}
