import Foundation
import Logging

/// A private PostgreSQL cluster run from the installed server binaries, used when the service
/// has no DATABASE_URL (and by tests, for throwaway clusters): a unix socket in a 0700 directory,
/// no TCP, durable unless told otherwise, run as an unprivileged account when we are root.
/// It holds no state: every call inspects the data directory, so any number of processes may
/// share one; whoever calls `start()` first starts it and it runs until someone calls `stop()`.
package struct EmbeddedPostgres: Sendable {
    package struct Options: Sendable {
        /// The cluster lives in `<dataDirectory>/pgdata`; the log, lock and (usually) the
        /// socket directory sit beside it. Relative paths resolve against the working directory.
        package var dataDirectory: String
        /// true: fsync, synchronous_commit and full_page_writes on (PostgreSQL's defaults), so a
        /// committed write survives a crash exactly as on a production server.
        /// false (tests only): all three off, and initdb skips its fsync.
        package var durable: Bool
        /// Created on first start if missing.
        package var database: String
        /// Explicit bin directory; else `SIWA_POSTGRES_BIN`; else the newest
        /// `/usr/lib/postgresql/*/bin` containing initdb; else the directory of `initdb` on PATH.
        package var binDirectory: String?
        /// Extra postgresql.conf settings (e.g. `["max_connections": "200"]`), passed with -c on
        /// every start. Settings EmbeddedPostgres manages itself (listen_addresses, fsync, …)
        /// are rejected.
        package var extraSettings: [String: String]

        package init(
            dataDirectory: String,
            durable: Bool = true,
            database: String = "siwa",
            binDirectory: String? = nil,
            extraSettings: [String: String] = [:]
        ) {
            self.dataDirectory = dataDirectory
            self.durable = durable
            self.database = database
            self.binDirectory = binDirectory
            self.extraSettings = extraSettings
        }
    }

    /// How to reach the cluster: a unix socket, no password (see `Cluster.hostBasedAuthentication`).
    package struct Connection: Sendable, Equatable {
        /// The directory containing `.s.PGSQL.<port>`.
        package var socketDirectory: String
        /// Only names the socket file; there is no TCP listener.
        package var port: Int
        /// The role to connect as: `serviceRole`, which owns the database and is no superuser.
        package var username: String
        /// The bootstrap superuser created by initdb, for administration only (tests that create
        /// roles and databases); the service never connects as it.
        package var superuser: String
        package var database: String
        /// false when another process (or another `EmbeddedPostgres` value) had already started
        /// the cluster and we attached to it; such a caller should normally not stop it.
        package var startedByUs: Bool

        package var socketPath: String { "\(socketDirectory)/.s.PGSQL.\(port)" }

        package init(socketDirectory: String, port: Int, username: String, superuser: String = EmbeddedPostgres.superuser, database: String, startedByUs: Bool) {
            self.socketDirectory = socketDirectory
            self.port = port
            self.username = username
            self.superuser = superuser
            self.database = database
            self.startedByUs = startedByUs
        }
    }

    /// The bootstrap superuser initdb creates (`initdb -U siwa`): used only to create the
    /// service role and its database, and to hand it the objects of clusters made before it.
    package static let superuser = "siwa"
    /// The role the service connects as: it owns the database and is not a superuser, so code
    /// that runs as the owner (a SECURITY DEFINER function) cannot reach beyond this database.
    package static let serviceRole = "siwa_service"
    /// The socket file is `.s.PGSQL.5432`; no TCP port is opened.
    package static let port = 5432

    package let options: Options
    let logger: Logger

    package init(options: Options, logger: Logger) {
        self.options = options
        self.logger = logger
    }

    /// Makes the cluster available and returns how to connect: runs initdb on first use, then
    /// `pg_ctl start -w` — or attaches when a postmaster already serves this data directory.
    /// Then creates the service role and its database if missing (see `serviceRole`). Idempotent; safe to call from several
    /// processes at once (an exclusive lock on `<dataDirectory>/.lock` serialises the sequence).
    package func start() async throws -> Connection {
        let layout = try ClusterLayout(dataDirectory: options.dataDirectory, port: Self.port)
        let settings = try ServerSettings(
            socketDirectory: layout.socketDirectory, port: Self.port,
            durable: options.durable, extra: options.extraSettings)
        guard !options.database.isEmpty, !options.database.contains("\0") else {
            throw EmbeddedPostgresError.databaseCreationFailed(
                database: options.database, output: "the database name is empty or contains a NUL character")
        }
        let binaries = try PostgresBinaries.locate(
            explicit: options.binDirectory, environment: ProcessInfo.processInfo.environment)
        // Refuse an unreachable location before creating anything in it.
        try await Cluster.account(for: layout).checkCanReach(layout)
        try FileSystem.createDirectoryTree(layout.dataDirectory)

        return try await StartLock.withLock(layout.lockFile, onWait: waitingForOtherProcess(layout)) {
            // Again under the lock: another process may have created the cluster meanwhile.
            let account = try await Cluster.account(for: layout)
            try account.checkCanReach(layout)
            let cluster = Cluster(layout: layout, binaries: binaries, account: account, logger: logger)

            let postmaster: Postmaster
            let startedByUs: Bool
            switch try await cluster.state() {
            case .running(let running):
                logger.info("attaching to running PostgreSQL", metadata: cluster.metadata.merging(["pid": "\(running.pid)"]) { $1 })
                postmaster = try await cluster.waitUntilReady(running)
                startedByUs = false
            case .uninitialized:
                try await cluster.initialize(durable: options.durable)
                fallthrough
            case .stopped:
                postmaster = try await cluster.start(settings: settings)
                startedByUs = true
            }

            try await cluster.ensureServiceDatabase(
                options.database, socketDirectory: postmaster.socketDirectory, port: postmaster.port)
            let connection = Connection(
                socketDirectory: postmaster.socketDirectory, port: postmaster.port,
                username: Self.serviceRole, database: options.database, startedByUs: startedByUs)
            logger.debug(
                "PostgreSQL ready",
                metadata: ["socket": "\(connection.socketPath)", "started_by_us": "\(startedByUs)", "pid": "\(postmaster.pid)"])
            return connection
        }
    }

    /// `pg_ctl stop -m fast -w`, whoever started the server. Does nothing when no cluster
    /// exists or no server is running.
    package func stop() async throws {
        let layout = try ClusterLayout(dataDirectory: options.dataDirectory, port: Self.port)
        guard Cluster.hasCluster(layout) else { return }
        let binaries = try PostgresBinaries.locate(
            explicit: options.binDirectory, environment: ProcessInfo.processInfo.environment)
        try await StartLock.withLock(layout.lockFile, onWait: waitingForOtherProcess(layout)) {
            let account = try ClusterAccount.forExistingCluster(pgdata: layout.pgdata)
            try await Cluster(layout: layout, binaries: binaries, account: account, logger: logger).stop()
        }
    }

    /// Where the cluster lives (or would): `<dataDirectory>/pgdata`, absolute.
    package var clusterDirectory: String { ClusterLayout.absoluteStandardized(options.dataDirectory) + "/pgdata" }

    /// Whether initdb has made a cluster there (`start()` would make one otherwise).
    package var clusterExists: Bool {
        guard let layout = try? ClusterLayout(dataDirectory: options.dataDirectory, port: Self.port) else { return false }
        return Cluster.hasCluster(layout)
    }

    /// Whether a postmaster serves this data directory (per `pg_ctl status`). False when
    /// anything needed to tell (cluster, binaries, account) is missing.
    package func isRunning() async -> Bool {
        guard let layout = try? ClusterLayout(dataDirectory: options.dataDirectory, port: Self.port),
              Cluster.hasCluster(layout),
              let binaries = try? PostgresBinaries.locate(
                  explicit: options.binDirectory, environment: ProcessInfo.processInfo.environment),
              let account = try? ClusterAccount.forExistingCluster(pgdata: layout.pgdata)
        else { return false }
        let cluster = Cluster(layout: layout, binaries: binaries, account: account, logger: logger)
        if case .running = try? await cluster.state() { return true }
        return false
    }

    private func waitingForOtherProcess(_ layout: ClusterLayout) -> () -> Void {
        { [logger] in
            logger.info(
                "waiting for another process to finish starting or stopping PostgreSQL",
                metadata: ["lock": "\(layout.lockFile)"])
        }
    }
}
