import Foundation
import Logging
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Real clusters from the installed PostgreSQL server binaries, each in its own temporary
/// directory. Running as root exercises the unprivileged-account path (PostgreSQL refuses root).
/// Serialized: each test starts its own postmaster, and two cores are plenty busy with one.
@Suite("Embedded PostgreSQL", .serialized, .timeLimit(.minutes(10)))
struct EmbeddedPostgresTests {
    @Test("a durable cluster keeps a committed row across stop and start, and reports itself running")
    func durableRestartKeepsData() async throws {
        try await withScratchDirectory { directory in
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: directory), logger: logger)

            let first = try await postgres.start()
            #expect(first.startedByUs)
            #expect(first.username == "siwa_service")
            #expect(first.database == "siwa")
            #expect(await postgres.isRunning())
            try await withClient(first) { client in
                #expect(try await firstValue(client, "SHOW fsync") == "on")
                #expect(try await firstValue(client, "SHOW synchronous_commit") == "on")
                #expect(try await firstValue(client, "SHOW full_page_writes") == "on")
                try await client.query("CREATE TABLE notes (id integer PRIMARY KEY, body text NOT NULL)")
                try await client.query("INSERT INTO notes (id, body) VALUES (1, \("survives a restart"))")
            }
            try await postgres.stop()
            #expect(await !postgres.isRunning())
            try await postgres.stop() // stopping a stopped cluster is fine

            let second = try await postgres.start()
            #expect(second.startedByUs)
            #expect(second == first)
            try await withClient(second) { client in
                let body = try await firstValue(client, "SELECT body FROM notes WHERE id = 1")
                #expect(body == "survives a restart")
            }
            try await postgres.stop()
        }
    }

    @Test("the service connects as a role that owns the database and is no superuser; a cluster whose objects the bootstrap superuser owns is handed over on start")
    func serviceRoleIsNoSuperuser() async throws {
        try await withScratchDirectory { directory in
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false), logger: logger)
            let first = try await postgres.start()
            try await withClient(first) { client in
                #expect(try await firstValue(client, "SELECT current_user::text") == "siwa_service")
                #expect(try await firstValue(client, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user") == "false")
                #expect(try await firstValue(client, "SELECT (rolcreaterole OR rolcreatedb OR rolbypassrls)::text FROM pg_roles WHERE rolname = current_user") == "false")
                #expect(try await firstValue(client, "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = current_database()") == "siwa_service")
                // What a superuser could do and the service cannot: run programs on the host.
                var refused = false
                do { try await client.query("COPY (SELECT 1) TO PROGRAM 'true'") } catch is PSQLError { refused = true }
                #expect(refused)
            }
            // A cluster from before the service role: the superuser owns the database and its
            // objects (a table with an identity column, a sequence, an enum, a function).
            var admin = first
            admin.username = first.superuser
            try await withClient(admin) { client in
                try await client.query("ALTER DATABASE siwa OWNER TO siwa")
                try await client.query("CREATE TYPE mood AS ENUM ('ok')")
                try await client.query("CREATE TABLE legacy (id bigint GENERATED ALWAYS AS IDENTITY, m mood)")
                try await client.query("CREATE SEQUENCE free_sequence")
                try await client.query("CREATE FUNCTION legacy_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM legacy'")
            }
            let second = try await postgres.start()
            try await withClient(second) { client in
                #expect(try await firstValue(client, "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = current_database()") == "siwa_service")
                let owners: PostgresQuery = """
                    SELECT string_agg(DISTINCT pg_get_userbyid(o), ',') FROM (
                        SELECT relowner FROM pg_class WHERE relnamespace = 'public'::regnamespace
                        UNION ALL SELECT proowner FROM pg_proc WHERE pronamespace = 'public'::regnamespace
                        UNION ALL SELECT typowner FROM pg_type WHERE typnamespace = 'public'::regnamespace) AS x(o)
                    """
                #expect(try await firstValue(client, owners) == "siwa_service")
                try await client.query("INSERT INTO legacy (m) VALUES ('ok')")
                try await client.query("ALTER TABLE legacy ADD COLUMN note text")
                #expect(try await firstValue(client, "SELECT legacy_count()::text") == "1")
            }
            try await postgres.stop()
        }
    }

    @Test("a second EmbeddedPostgres on a running data directory attaches and sees the same data")
    func secondInstanceAttaches() async throws {
        try await withScratchDirectory { directory in
            let options = EmbeddedPostgres.Options(dataDirectory: directory, durable: false)
            let owner = EmbeddedPostgres(options: options, logger: logger)
            let first = try await owner.start()
            try await withClient(first) { client in
                try await client.query("CREATE TABLE shared (value text)")
                try await client.query("INSERT INTO shared VALUES ('written by the first')")
            }

            let second = try await EmbeddedPostgres(options: options, logger: logger).start()
            #expect(first.startedByUs)
            #expect(!second.startedByUs)
            #expect(second.socketPath == first.socketPath)
            try await withClient(second) { client in
                let value = try await firstValue(client, "SELECT value FROM shared")
                #expect(value == "written by the first")
            }
            try await owner.stop()
        }
    }

    @Test("two starts racing on one data directory yield one start and one attach")
    func concurrentStartsStartOnce() async throws {
        try await withScratchDirectory { directory in
            let options = EmbeddedPostgres.Options(dataDirectory: directory, durable: false)
            async let a = EmbeddedPostgres(options: options, logger: logger).start()
            async let b = EmbeddedPostgres(options: options, logger: logger).start()
            let connections = try await [a, b]
            #expect(connections.filter(\.startedByUs).count == 1)
            #expect(connections[0].socketPath == connections[1].socketPath)
            try await EmbeddedPostgres(options: options, logger: logger).stop()
        }
    }

    @Test("the cluster has no TCP listener, only local pg_hba rules, and a 0700 socket directory")
    func reachableOnlyThroughPrivateSocket() async throws {
        try await withScratchDirectory { directory in
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false), logger: logger)
            let connection = try await postgres.start()
            var admin = connection
            admin.username = connection.superuser  // pg_hba_file_rules is the superuser's to read
            try await withClient(admin) { client in
                #expect(try await firstValue(client, "SHOW listen_addresses") == "")
                #expect(try await firstValue(client, "SHOW unix_socket_permissions") == "0700")
                let types = try await allValues(client, "SELECT DISTINCT type FROM pg_hba_file_rules")
                #expect(types == ["local"])
            }
            let permissions = try FileManager.default.attributesOfItem(atPath: connection.socketDirectory)[.posixPermissions] as? Int
            #expect(permissions.map { $0 & 0o777 } == 0o700)
            try await postgres.stop()
        }
    }

    @Test("a data directory too deep for a unix socket path still starts, with a short socket directory")
    func longDataDirectoryUsesShortSocketDirectory() async throws {
        try await withScratchDirectory { directory in
            let deep = [directory, String(repeating: "a", count: 40), String(repeating: "b", count: 40),
                        String(repeating: "c", count: 30)].joined(separator: "/")
            #expect(deep.utf8.count > 110)
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: deep, durable: false), logger: logger)
            let connection = try await postgres.start()
            defer { try? FileManager.default.removeItem(atPath: connection.socketDirectory) }
            #expect(connection.socketPath.utf8.count <= 100)
            #expect(!connection.socketDirectory.hasPrefix(directory))
            try await withClient(connection) { client in
                let database = try await firstValue(client, "SELECT current_database()")
                #expect(database == "siwa")
            }
            try await postgres.stop()
        }
    }

    @Test("a non-durable cluster turns fsync off and applies extra settings and the database name")
    func nonDurableAppliesExtraSettings() async throws {
        try await withScratchDirectory { directory in
            let options = EmbeddedPostgres.Options(
                dataDirectory: directory, durable: false, database: "other_db",
                extraSettings: ["max_connections": "42"])
            let postgres = EmbeddedPostgres(options: options, logger: logger)
            let connection = try await postgres.start()
            #expect(connection.database == "other_db")
            try await withClient(connection) { client in
                let values = try await allValues(client, """
                    SELECT current_setting('fsync') || ' ' || current_setting('synchronous_commit') || ' '
                        || current_setting('full_page_writes') || ' ' || current_setting('max_connections') || ' '
                        || current_database()
                    """)
                #expect(values == ["off off off 42 other_db"])
            }
            try await postgres.stop()
        }
    }

    @Test("an extra setting that would reopen TCP is refused with an explanation")
    func managedSettingsCannotBeOverridden() async throws {
        try await withScratchDirectory { directory in
            let options = EmbeddedPostgres.Options(
                dataDirectory: directory, durable: false, extraSettings: ["listen_addresses": "*"])
            let error = await startError(EmbeddedPostgres(options: options, logger: logger))
            #expect(error?.description.contains("listen_addresses") == true)
        }
    }

    @Test("a crashed postmaster's leftover postmaster.pid does not prevent the next start")
    func restartsAfterCrash() async throws {
        try await withScratchDirectory { directory in
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: directory), logger: logger)
            let connection = try await postgres.start()
            try await withClient(connection) { client in
                try await client.query("CREATE TABLE crash (value integer)")
                try await client.query("INSERT INTO crash VALUES (7)")
            }
            try await PostmasterCrash.kill(pgdata: "\(directory)/pgdata")
            #expect(FileManager.default.fileExists(atPath: "\(directory)/pgdata/postmaster.pid"))

            let restarted = try await postgres.start()
            #expect(restarted.startedByUs)
            try await withClient(restarted) { client in
                let value = try await firstValue(client, "SELECT value::text FROM crash")
                #expect(value == "7")
            }
            try await postgres.stop()
        }
    }

    @Test("a server that refuses to start yields an error quoting the end of its log")
    func failedStartQuotesServerLog() async throws {
        try await withScratchDirectory { directory in
            let options = EmbeddedPostgres.Options(
                dataDirectory: directory, durable: false, extraSettings: ["max_connections": "not-a-number"])
            let postgres = EmbeddedPostgres(options: options, logger: logger)
            let error = await startError(postgres)
            let description = error?.description ?? ""
            #expect(description.contains("postgres.log"))
            #expect(description.contains("max_connections")) // the server's own complaint, from the log
            #expect(await !postgres.isRunning())
        }
    }

    @Test("a cluster from another PostgreSQL major version is refused with what to do")
    func otherMajorVersionIsRefused() async throws {
        try await withScratchDirectory { directory in
            let postgres = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false), logger: logger)
            _ = try await postgres.start()
            try await postgres.stop()
            try "9.6\n".write(toFile: "\(directory)/pgdata/PG_VERSION", atomically: false, encoding: .utf8)

            let error = await startError(postgres)
            let description = error?.description ?? ""
            #expect(description.contains("PostgreSQL 9.6"))
            #expect(description.contains("pg_upgrade"))
        }
    }

    @Test("missing server binaries produce an error that says how to install them")
    func missingBinariesExplainInstallation() async throws {
        try await withScratchDirectory { directory in
            let emptyBin = "\(directory)/bin"
            try FileManager.default.createDirectory(atPath: emptyBin, withIntermediateDirectories: true)
            let options = EmbeddedPostgres.Options(dataDirectory: "\(directory)/data", binDirectory: emptyBin)
            let postgres = EmbeddedPostgres(options: options, logger: logger)
            let error = await startError(postgres)
            #expect(error?.description.contains("apt-get install -y postgresql") == true)
            #expect(error?.description.contains("DATABASE_URL") == true)
            #expect(await !postgres.isRunning())
        }
    }
}

// MARK: - Helpers

private let logger: Logger = {
    var logger = Logger(label: "siwa.tests.embedded-postgres")
    logger.logLevel = .info
    return logger
}()

/// PostgresClient warns when a query races ahead of `run()` starting; it waits correctly anyway.
private let clientLogger: Logger = {
    var logger = Logger(label: "siwa.tests.embedded-postgres.client")
    logger.logLevel = .error
    return logger
}()

/// A fresh /tmp/siwa-t-XXXXXX (short, so the socket fits beside the data), removed afterwards.
/// Made 0755: as root the cluster runs as an unprivileged account, which must traverse it.
private func withScratchDirectory(_ body: (String) async throws -> Void) async throws {
    var template = Array("/tmp/siwa-t-XXXXXX".utf8CString)
    let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    let directory = try #require(created.map { String(cString: $0) })
    #expect(chmod(directory, 0o755) == 0)
    do {
        try await body(directory)
    } catch {
        await removeScratchDirectory(directory)
        throw error
    }
    await removeScratchDirectory(directory)
}

/// Stops any cluster a failed test left running below `directory`, then deletes it all.
private func removeScratchDirectory(_ directory: String) async {
    let enumerator = FileManager.default.enumerator(atPath: directory)
    while let path = enumerator?.nextObject() as? String {
        guard (path as NSString).lastPathComponent == "pgdata" else { continue }
        let dataDirectory = "\(directory)/\((path as NSString).deletingLastPathComponent)"
        try? await EmbeddedPostgres(options: .init(dataDirectory: dataDirectory), logger: logger).stop()
        enumerator?.skipDescendants()
    }
    try? FileManager.default.removeItem(atPath: directory)
}

private func startError(_ postgres: EmbeddedPostgres) async -> EmbeddedPostgresError? {
    do {
        let connection = try await postgres.start()
        Issue.record("start() unexpectedly succeeded: \(connection)")
        try? await postgres.stop()
        return nil
    } catch let error as EmbeddedPostgresError {
        return error
    } catch {
        Issue.record("unexpected error type: \(error)")
        return nil
    }
}

/// Runs `body` with a PostgresClient connected over the cluster's unix socket. The client
/// only hands out connections while `run()` is running, so it runs in a child task.
private func withClient(
    _ connection: EmbeddedPostgres.Connection,
    _ body: (PostgresClient) async throws -> Void
) async throws {
    let configuration = PostgresClient.Configuration(
        unixSocketPath: connection.socketPath, username: connection.username,
        password: nil, database: connection.database)
    let client = PostgresClient(configuration: configuration, backgroundLogger: clientLogger)
    try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        try await body(client)
    }
}

private func allValues(_ client: PostgresClient, _ query: PostgresQuery) async throws -> [String] {
    var values: [String] = []
    for try await value in try await client.query(query).decode(String.self) {
        values.append(value)
    }
    return values
}

private func firstValue(_ client: PostgresClient, _ query: PostgresQuery) async throws -> String? {
    try await allValues(client, query).first
}
