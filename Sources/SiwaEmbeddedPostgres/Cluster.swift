import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// One data directory with its binaries and OS account resolved: the steps behind
/// `EmbeddedPostgres.start()`, `stop()` and `isRunning()`. Callers hold the `StartLock` around
/// anything that changes the cluster.
struct Cluster: Sendable {
    let layout: ClusterLayout
    let binaries: PostgresBinaries
    let account: ClusterAccount
    let logger: Logger

    /// Where the cluster stands, as far as the next step is concerned.
    enum State: Sendable {
        /// No cluster yet (no pgdata, or an empty one): initdb, then start.
        case uninitialized
        /// A cluster exists and no postmaster serves it (possibly after a crash): start.
        case stopped
        /// A postmaster serves it: attach.
        case running(Postmaster)
    }

    /// The OS account for `layout`: the owner of an existing cluster, else a fresh choice.
    static func account(for layout: ClusterLayout) async throws -> ClusterAccount {
        if hasCluster(layout) {
            // Readable yet without PG_VERSION: not a cluster at all, whoever owns it.
            if (try? FileManager.default.contentsOfDirectory(atPath: layout.pgdata)) != nil,
               !FileSystem.exists(layout.versionFile) {
                throw EmbeddedPostgresError.notAClusterDirectory(path: layout.pgdata)
            }
            return try ClusterAccount.forExistingCluster(pgdata: layout.pgdata)
        }
        return try await ClusterAccount.forNewCluster()
    }

    /// Whether pgdata holds something (an unreadable directory counts: its owner decides).
    static func hasCluster(_ layout: ClusterLayout) -> Bool {
        FileSystem.exists(layout.pgdata) && !FileSystem.isEmptyDirectory(layout.pgdata)
    }

    /// `pg_ctl status`, not the mere existence of postmaster.pid: a crash leaves that file
    /// behind with a dead pid, and pg_ctl checks whether the process is alive.
    func state() async throws -> State {
        guard Self.hasCluster(layout) else { return .uninitialized }
        guard FileSystem.exists(layout.versionFile) else {
            throw EmbeddedPostgresError.notAClusterDirectory(path: layout.pgdata)
        }
        let result = try await run(.pgCtl, ["status", "-D", layout.pgdata])
        switch (result.terminatedBySignal, result.status) {
        case (false, 0):
            guard let postmaster = Postmaster(pidFile: layout.postmasterPidFile) else {
                return .stopped // exited between pg_ctl's check and our read
            }
            if postmaster.unrelatedProcessName != nil {
                return .stopped // a stale file whose pid was recycled; see `removeStalePidFile`
            }
            return .running(postmaster)
        case (false, 3):
            return .stopped
        default:
            throw EmbeddedPostgresError.commandFailed(
                command: "pg_ctl status -D \(layout.pgdata)", output: result.combinedOutput)
        }
    }

    /// Runs initdb into a staging directory and renames it into place once complete, so a crash
    /// halfway through never leaves a half-made cluster that later looks real.
    func initialize(durable: Bool) async throws {
        logger.info("creating PostgreSQL cluster", metadata: metadata)
        let staging = layout.stagingDirectory
        if FileSystem.exists(staging) {
            do {
                try FileManager.default.removeItem(atPath: staging)
            } catch {
                throw EmbeddedPostgresError.fileSystem(
                    operation: "remove the leftover of an interrupted initdb,", path: staging, reason: "\(error)")
            }
        }
        guard mkdir(staging, 0o700) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "create the directory", path: staging, reason: FileSystem.errorText())
        }
        try account.takeOwnership(of: staging)

        var arguments = [
            "-D", staging, "-U", EmbeddedPostgres.superuser,
            "--auth=trust", "--encoding=UTF8", "--no-locale",
        ]
        // Throwaway test clusters skip initdb's fsync of every file; a durable one never does.
        if !durable { arguments.append("--no-sync") }
        let result = try await run(.initdb, arguments)
        guard result.succeeded else {
            try? FileManager.default.removeItem(atPath: staging)
            throw EmbeddedPostgresError.initdbFailed(pgdata: layout.pgdata, output: result.combinedOutput)
        }
        try FileSystem.append(Self.managedConfiguration, to: "\(staging)/postgresql.conf")

        if FileSystem.exists(layout.pgdata), rmdir(layout.pgdata) != 0 {
            throw EmbeddedPostgresError.fileSystem(
                operation: "replace the empty directory", path: layout.pgdata, reason: FileSystem.errorText())
        }
        guard rename(staging, layout.pgdata) == 0 else {
            throw EmbeddedPostgresError.fileSystem(operation: "move the new cluster to", path: layout.pgdata, reason: FileSystem.errorText())
        }
        FileSystem.syncDirectory(layout.dataDirectory)
    }

    /// Appended to postgresql.conf once, so even a manual `pg_ctl start` opens no TCP port.
    /// Everything else is passed with -c on every start (see `ServerSettings`).
    static let managedConfiguration = """

        # --- added by siwa-events ---
        # This cluster is reachable only through a unix socket in a private (0700) directory.
        # siwa-events passes the socket directory and durability settings with -c on every start.
        listen_addresses = ''

        """

    /// Only unix-socket connections exist at all. `trust` is safe solely because the socket
    /// directory is 0700: only the cluster's OS user (and root) can reach the socket.
    static let hostBasedAuthentication = """
        # Managed by siwa-events: rewritten on every start.
        # Unix-socket connections only (the socket directory is mode 0700); no host lines, no TCP.
        # Replication too, over that socket: a standby on this machine (pg_basebackup, tests).
        local   all   all   trust
        local   replication   all   trust

        """

    /// `pg_ctl start -w`: waits until the server accepts connections (or 60 s pass).
    func start(settings: ServerSettings) async throws -> Postmaster {
        try await checkVersion()
        try removeStalePidFile()
        try FileSystem.prepareSocketDirectory(layout.socketDirectory, for: account)
        try FileSystem.prepareAccountFile(layout.logFile, for: account)
        try FileSystem.writeAccountFile(
            "\(layout.pgdata)/pg_hba.conf", contents: Self.hostBasedAuthentication, for: account)

        logger.info("starting PostgreSQL", metadata: metadata.merging(["log": "\(layout.logFile)"]) { $1 })
        let result = try await run(.pgCtl, [
            "start", "-D", layout.pgdata, "-w", "-t", "60", "-l", layout.logFile, "-o", settings.commandLineOptions,
        ])
        guard result.succeeded else {
            throw EmbeddedPostgresError.startFailed(
                pgdata: layout.pgdata, output: result.combinedOutput,
                logFile: layout.logFile, logTail: FileSystem.tail(layout.logFile, lines: 20))
        }
        guard let postmaster = Postmaster(pidFile: layout.postmasterPidFile) else {
            throw EmbeddedPostgresError.startFailed(
                pgdata: layout.pgdata, output: "pg_ctl reported success, but postmaster.pid is missing",
                logFile: layout.logFile, logTail: FileSystem.tail(layout.logFile, lines: 20))
        }
        return postmaster
    }

    /// pg_ctl and the postmaster only ask "is this pid alive?". After a reboot or container
    /// restart the pid in a crashed server's postmaster.pid may belong to an unrelated process
    /// of the same user (even to us); the postmaster would then refuse to start, so the file goes.
    /// A dead pid needs nothing: PostgreSQL replaces such a file itself.
    private func removeStalePidFile() throws {
        guard let postmaster = Postmaster(pidFile: layout.postmasterPidFile),
              let program = postmaster.unrelatedProcessName else { return }
        logger.warning(
            "removing stale postmaster.pid: its pid now belongs to another program",
            metadata: ["pid": "\(postmaster.pid)", "program": "\(program)", "pgdata": "\(layout.pgdata)"])
        guard unlink(layout.postmasterPidFile) == 0 || errno == ENOENT else {
            throw EmbeddedPostgresError.fileSystem(
                operation: "remove the stale", path: layout.postmasterPidFile, reason: FileSystem.errorText())
        }
    }

    /// A cluster from another major version would make the server exit with a terse FATAL;
    /// say plainly what is going on instead.
    private func checkVersion() async throws {
        guard let clusterVersion = FileSystem.readText(layout.versionFile)?
            .trimmingCharacters(in: .whitespacesAndNewlines) else { return }
        let result = try await run(.postgres, ["--version"])
        guard let binariesVersion = PostgresBinaries.majorVersion(fromVersionOutput: result.standardOutput) else {
            logger.debug("could not determine the server version", metadata: ["output": "\(result.combinedOutput)"])
            return
        }
        guard clusterVersion == binariesVersion else {
            throw EmbeddedPostgresError.clusterVersionMismatch(
                pgdata: layout.pgdata, clusterVersion: clusterVersion,
                binariesVersion: binariesVersion, binDirectory: binaries.directory)
        }
    }

    /// A postmaster found running may still be starting up (or recovering after a backend
    /// crash); wait, like `pg_ctl start -w` does, until it reports ready.
    func waitUntilReady(_ postmaster: Postmaster) async throws -> Postmaster {
        var current = postmaster
        let deadline = ContinuousClock.now + .seconds(60)
        while !current.isReady {
            guard ContinuousClock.now < deadline else {
                throw EmbeddedPostgresError.attachFailed(
                    pgdata: layout.pgdata,
                    reason: "it did not become ready within 60 seconds (status '\(current.status)'; see \(layout.logFile))")
            }
            try await Task.sleep(for: .milliseconds(100))
            guard let next = Postmaster(pidFile: layout.postmasterPidFile) else {
                throw EmbeddedPostgresError.attachFailed(
                    pgdata: layout.pgdata, reason: "it exited while we waited for it to accept connections")
            }
            current = next
        }
        guard !current.socketDirectory.isEmpty else {
            throw EmbeddedPostgresError.attachFailed(pgdata: layout.pgdata, reason: "it has no unix socket")
        }
        return current
    }

    /// Makes `database` belong to the service role, connecting over the unix socket as the
    /// bootstrap superuser (its only use): creates the role (LOGIN, no superuser, no CREATEDB or
    /// CREATEROLE) and the database if missing; a database the superuser owns (a cluster made
    /// before the role existed) is handed over with its objects in schema public.
    func ensureServiceDatabase(_ database: String, socketDirectory: String, port: Int) async throws {
        let connection = ["-h", socketDirectory, "-p", "\(port)", "-U", EmbeddedPostgres.superuser]
        let psql = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"] + connection
        let literal = "'\(database.replacingOccurrences(of: "'", with: "''"))'"
        let role = EmbeddedPostgres.serviceRole
        let prepare = try await run(.psql, psql + [
            "-d", "postgres", "-c", """
                DO $$ BEGIN
                    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '\(role)') THEN
                        CREATE ROLE \(role) LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
                    END IF;
                END $$;
                SELECT pg_catalog.pg_get_userbyid(datdba) FROM pg_catalog.pg_database WHERE datname = \(literal);
                """,
        ])
        guard prepare.succeeded else {
            throw EmbeddedPostgresError.commandFailed(
                command: "psql (creating role \(role), checking whether database '\(database)' exists)", output: prepare.combinedOutput)
        }
        switch prepare.standardOutput.trimmingCharacters(in: .whitespacesAndNewlines) {
        case "":
            logger.info("creating database", metadata: ["database": "\(database)", "owner": "\(role)"])
            let create = try await run(.createdb, connection + ["--owner", role, "--", database])
            guard create.succeeded else {
                throw EmbeddedPostgresError.databaseCreationFailed(database: database, output: create.combinedOutput)
            }
        case role:
            break
        default:
            // A cluster from before the service role: the superuser owns the database and its objects.
            logger.notice("handing the database to the non-superuser role", metadata: ["database": "\(database)", "owner": "\(role)"])
            // Objects first, the database last: an interrupted hand-over is taken up again next start.
            let handOver = try await run(.psql, psql + ["-d", database, "-c", EmbeddedPostgres.handOverObjects(from: EmbeddedPostgres.superuser, to: role)])
            guard handOver.succeeded else {
                throw EmbeddedPostgresError.commandFailed(
                    command: "psql (handing objects in schema public of '\(database)' to \(role))", output: handOver.combinedOutput)
            }
            let alter = try await run(.psql, psql + [
                "-d", "postgres", "-c", "DO $$ BEGIN EXECUTE pg_catalog.format('ALTER DATABASE %I OWNER TO \(role)', \(literal)); END $$;",
            ])
            guard alter.succeeded else {
                throw EmbeddedPostgresError.commandFailed(command: "psql (ALTER DATABASE \(database) OWNER TO \(role))", output: alter.combinedOutput)
            }
        }
    }

    /// `pg_ctl stop -m fast -w`: rolls back open transactions, checkpoints, exits.
    func stop() async throws {
        guard case .running = try await state() else {
            logger.debug("PostgreSQL is not running; nothing to stop", metadata: metadata)
            return
        }
        logger.info("stopping PostgreSQL", metadata: metadata)
        let result = try await run(.pgCtl, ["stop", "-D", layout.pgdata, "-m", "fast", "-w", "-t", "60"])
        guard !result.succeeded else { return }
        if case .running = try await state() {
            throw EmbeddedPostgresError.stopFailed(pgdata: layout.pgdata, output: result.combinedOutput)
        }
    }

    var metadata: Logger.Metadata {
        [
            "pgdata": "\(layout.pgdata)",
            "socket_dir": "\(layout.socketDirectory)",
            "os_user": "\(account.name)",
            "bin_dir": "\(binaries.directory)",
        ]
    }

    func run(_ tool: PostgresBinaries.Tool, _ arguments: [String]) async throws -> CommandResult {
        let command = try account.commandLine(binaries.path(tool), arguments)
        logger.debug("running \(tool.rawValue)", metadata: ["arguments": "\(arguments.joined(separator: " "))"])
        let result = try await Subprocess.run(
            command.executable, command.arguments,
            environment: account.environment(from: ProcessInfo.processInfo.environment))
        logger.debug(
            "\(tool.rawValue) finished",
            metadata: ["status": "\(result.status)", "output": "\(result.combinedOutput)"])
        return result
    }
}

extension EmbeddedPostgres {
    /// Every table, view, sequence (not one a column owns: it follows its table), routine, type
    /// and the schema itself that `superuser` owns in schema public, given to `role` (REASSIGN OWNED refuses the
    /// bootstrap superuser, whose system objects cannot change hands).
    package static func handOverObjects(from superuser: String, to role: String) -> String {
        """
            DO $$ DECLARE statement text; BEGIN
                FOR statement IN
                    SELECT pg_catalog.format('ALTER %s %s OWNER TO \(role)',
                        CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END,
                        c.oid::pg_catalog.regclass)
                    FROM pg_catalog.pg_class c
                    WHERE c.relnamespace = 'public'::pg_catalog.regnamespace AND c.relowner = '\(superuser)'::pg_catalog.regrole
                      AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c')
                      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                          WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
                    UNION ALL
                    SELECT pg_catalog.format('ALTER ROUTINE %s OWNER TO \(role)', p.oid::pg_catalog.regprocedure)
                    FROM pg_catalog.pg_proc p
                    WHERE p.pronamespace = 'public'::pg_catalog.regnamespace AND p.proowner = '\(superuser)'::pg_catalog.regrole
                    UNION ALL
                    SELECT pg_catalog.format('ALTER TYPE %s OWNER TO \(role)', t.oid::pg_catalog.regtype)
                    FROM pg_catalog.pg_type t
                    WHERE t.typnamespace = 'public'::pg_catalog.regnamespace AND t.typowner = '\(superuser)'::pg_catalog.regrole
                      AND t.typtype IN ('e', 'd', 'r')
                    UNION ALL
                    SELECT 'ALTER SCHEMA public OWNER TO \(role)' FROM pg_catalog.pg_namespace
                    WHERE nspname = 'public' AND nspowner = '\(superuser)'::pg_catalog.regrole
                LOOP
                    EXECUTE statement;
                END LOOP;
            END $$;
            """
    }
}
