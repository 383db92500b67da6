/// Why the embedded cluster could not be started, attached to or stopped.
///
/// Every description says what went wrong *and* what to do about it, because these messages
/// end up in front of an operator running `siwa-events serve` on a machine we have never seen.
package enum EmbeddedPostgresError: Error, CustomStringConvertible {
    /// No directory with `initdb` was found. `searched` lists the places looked at, in order.
    case binariesNotFound(searched: [String])
    /// A bin directory has `initdb` but lacks other tools we need.
    case incompleteBinaries(directory: String, missing: [String])
    /// The data directory path contains characters `pg_ctl` cannot pass through its shell.
    case unsupportedDataDirectory(path: String, reason: String)
    /// An `extraSettings` key is one EmbeddedPostgres controls itself, or is not a setting name.
    case invalidSetting(name: String, reason: String)
    /// `pgdata` exists and is not empty, but holds no PostgreSQL cluster.
    case notAClusterDirectory(path: String)
    /// The cluster was created by another PostgreSQL major version than the binaries found.
    case clusterVersionMismatch(pgdata: String, clusterVersion: String, binariesVersion: String, binDirectory: String)
    /// The cluster's files belong to an OS account we cannot (or must not) run PostgreSQL as.
    case clusterOwnedByAnotherUser(pgdata: String, owner: String, currentUser: String)
    /// Running as root, the cluster's files belong to root or to a uid without an account.
    case clusterOwnerUnusable(pgdata: String, owner: String)
    /// Running as root, the cluster's OS account cannot reach the data directory.
    case dataDirectoryUnreachable(dataDirectory: String, blockingDirectory: String, user: String)
    /// Running as root, we need an unprivileged account and could neither find nor create one.
    case clusterUserUnavailable(reason: String)
    /// A socket directory exists but is not a private directory of the cluster's account.
    case unsafeSocketDirectory(path: String, reason: String)
    /// A file-system step (creating directories, ownership, the lock file) failed.
    case fileSystem(operation: String, path: String, reason: String)
    /// `initdb` exited unsuccessfully.
    case initdbFailed(pgdata: String, output: String)
    /// `pg_ctl start` exited unsuccessfully. `logTail` holds the last lines of the server log.
    case startFailed(pgdata: String, output: String, logFile: String, logTail: String)
    /// `pg_ctl stop` failed and the server is still running.
    case stopFailed(pgdata: String, output: String)
    /// A postmaster is running for the data directory but could not be used.
    case attachFailed(pgdata: String, reason: String)
    /// The configured database did not exist and could not be created.
    case databaseCreationFailed(database: String, output: String)
    /// Another PostgreSQL tool (`pg_ctl status`, `psql`, …) failed unexpectedly.
    case commandFailed(command: String, output: String)

    package var description: String {
        switch self {
        case .binariesNotFound(let searched):
            return "PostgreSQL server binaries not found (looked in \(searched.joined(separator: ", "))). "
                + "Install them with `apt-get install -y postgresql`, or set DATABASE_URL to use an existing server."
        case .incompleteBinaries(let directory, let missing):
            return "The PostgreSQL bin directory \(directory) is missing \(missing.joined(separator: ", ")). "
                + "Install the complete server package (`apt-get install -y postgresql`), point SIWA_POSTGRES_BIN "
                + "at a complete PostgreSQL bin directory, or set DATABASE_URL to use an existing server."
        case .unsupportedDataDirectory(let path, let reason):
            return "The data directory \(path) cannot be used: \(reason). "
                + "Set SIWA_DATA_DIR to a plain path (letters, digits, '/', '-', '_', '.')."
        case .invalidSetting(let name, let reason):
            return "The PostgreSQL setting '\(name)' cannot be passed as an extra setting: \(reason). "
                + "Remove it from the extra settings."
        case .notAClusterDirectory(let path):
            return "\(path) exists and is not empty, but it holds no PostgreSQL cluster (there is no PG_VERSION file). "
                + "Move it out of the way (or delete it if its contents are not needed), then start again; "
                + "a new cluster will be created there."
        case .clusterVersionMismatch(let pgdata, let clusterVersion, let binariesVersion, let binDirectory):
            return "The cluster in \(pgdata) was created by PostgreSQL \(clusterVersion), but the server binaries in "
                + "\(binDirectory) are PostgreSQL \(binariesVersion). Point SIWA_POSTGRES_BIN at PostgreSQL "
                + "\(clusterVersion) binaries, or upgrade the cluster with pg_upgrade (or pg_dumpall with the old "
                + "version and restore with the new one). To start over with an empty database instead, delete "
                + "\(pgdata) (this erases its data)."
        case .clusterOwnedByAnotherUser(let pgdata, let owner, let currentUser):
            return "The cluster in \(pgdata) belongs to the OS user \(owner), but this process runs as \(currentUser). "
                + "Run siwa-events as \(owner) (or as root), or set SIWA_DATA_DIR to a directory of your own."
        case .clusterOwnerUnusable(let pgdata, let owner):
            return "The cluster in \(pgdata) belongs to \(owner), which PostgreSQL cannot run as (it refuses root, and "
                + "an owner needs an account). Hand it to an unprivileged user, e.g. `chown -R postgres: \(pgdata)`, "
                + "then start again."
        case .dataDirectoryUnreachable(let dataDirectory, let blockingDirectory, let user):
            return "PostgreSQL runs as the unprivileged OS user \(user) (it refuses to run as root), and that user "
                + "cannot enter \(blockingDirectory), so it cannot reach the data directory \(dataDirectory). "
                + "Set SIWA_DATA_DIR to a path that \(user) can reach, e.g. /var/lib/siwa."
        case .clusterUserUnavailable(let reason):
            return "Running as root, PostgreSQL needs an unprivileged OS user, but none is usable: \(reason). "
                + "Create one with `useradd --system --no-create-home --shell /usr/sbin/nologin siwa-postgres`, "
                + "or run siwa-events as a non-root user."
        case .unsafeSocketDirectory(let path, let reason):
            return "The socket directory \(path) is not safe to use: \(reason). "
                + "Remove it (it only ever holds the server's socket and lock file), then start again."
        case .fileSystem(let operation, let path, let reason):
            return "Could not \(operation) \(path): \(reason). Check that the path is on a writable file system and "
                + "that this user may write there, or set SIWA_DATA_DIR to another directory."
        case .initdbFailed(let pgdata, let output):
            return "initdb could not create the PostgreSQL cluster in \(pgdata):\n\(output)\n"
                + "Fix the cause shown above (often disk space or permissions), then start again."
        case .startFailed(let pgdata, let output, let logFile, let logTail):
            return "PostgreSQL failed to start for \(pgdata):\n\(output)\nLast lines of \(logFile):\n\(logTail)\n"
                + "Fix the cause shown above, then start again. To start over with an empty database, "
                + "delete \(pgdata) (this erases its data)."
        case .stopFailed(let pgdata, let output):
            return "PostgreSQL for \(pgdata) did not stop:\n\(output)\n"
                + "Retry, or stop it by hand with `pg_ctl stop -D \(pgdata) -m immediate` as the cluster's OS user."
        case .attachFailed(let pgdata, let reason):
            return "A PostgreSQL server is running for \(pgdata) but cannot be used: \(reason). "
                + "Stop it (`pg_ctl stop -D \(pgdata)` as the cluster's OS user), then start again."
        case .databaseCreationFailed(let database, let output):
            return "Could not create the database '\(database)':\n\(output)\n"
                + "Fix the cause shown above, or choose another database name."
        case .commandFailed(let command, let output):
            return "`\(command)` failed:\n\(output)\nFix the cause shown above, then retry."
        }
    }
}
