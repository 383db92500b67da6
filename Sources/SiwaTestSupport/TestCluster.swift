import Foundation
import Logging
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaStore

/// One throwaway PostgreSQL cluster per test process, a migrated template database, and a fresh
/// `CREATE DATABASE … TEMPLATE` per test: real PostgreSQL, isolated tests, no mocks.
package actor TestCluster {
    package static let shared = TestCluster()

    private var connection: EmbeddedPostgres.Connection?
    private var counter = 0
    private let logger = Logger(label: "test-cluster")

    /// Short, per-process directory (a unix socket path must stay under ~107 bytes).
    package static let directory = "/tmp/siwa-test-\(ProcessInfo.processInfo.processIdentifier)"

    private func started() async throws -> EmbeddedPostgres.Connection {
        if let connection { return connection }
        Self.stopLeftovers()
        let cluster = EmbeddedPostgres(
            options: .init(dataDirectory: Self.directory, durable: false, database: "siwa_template", extraSettings: ["max_connections": "500"]),
            logger: logger)
        let connection = try await cluster.start()
        registerStopAtExit(dataDirectory: Self.directory, binDirectory: nil)
        let client = PostgresClient(configuration: Self.configuration(connection, database: "siwa_template"))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            try await Migrator(client: client, logger: logger).migrate()
            group.cancelAll()
        }
        self.connection = connection
        return connection
    }

    /// As the bootstrap superuser: tests create roles and databases, and act as any role.
    package static func configuration(_ connection: EmbeddedPostgres.Connection, database: String) -> PostgresClient.Configuration {
        var configuration = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.superuser, password: nil, database: database)
        configuration.options.maximumConnections = 40
        return configuration
    }

    /// A new database, migrated (copied from the template), for one test.
    package func makeDatabase() async throws -> PostgresClient.Configuration {
        try await createDatabase(prefix: "t", template: "siwa_template")
    }

    /// A new, empty database (no migrations applied), for migration tests.
    package func makeEmptyDatabase() async throws -> PostgresClient.Configuration {
        try await createDatabase(prefix: "e", template: "template0")
    }

    private func createDatabase(prefix: String, template: String) async throws -> PostgresClient.Configuration {
        let connection = try await started()
        counter += 1
        let name = "\(prefix)\(counter)"
        let admin = PostgresClient(configuration: Self.configuration(connection, database: "postgres"))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await admin.run() }
            // CREATE DATABASE … TEMPLATE refuses while any session is on the template — including
            // an autovacuum worker, which PostgreSQL asks to stop but waits for only 5 s: on a
            // machine busy with a whole parallel test run, that can be too short. Try again.
            for attempt in 1... {
                do {
                    try await admin.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name) TEMPLATE \(template)"))
                    break
                } catch let error as PSQLError where error.serverInfo?[.sqlState] == "55006" && attempt < 20 {
                    try await Task.sleep(for: .milliseconds(250))
                }
            }
            group.cancelAll()
        }
        return Self.configuration(connection, database: name)
    }

    /// Clusters left by test processes that died without their exit handler.
    private static func stopLeftovers() {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/tmp") else { return }
        for entry in entries where entry.hasPrefix("siwa-test-") {
            guard let pid = Int32(entry.dropFirst("siwa-test-".count)), pid != ProcessInfo.processInfo.processIdentifier, kill(pid, 0) != 0 else {
                continue
            }
            stopClusterSynchronously(dataDirectory: "/tmp/\(entry)")
            try? FileManager.default.removeItem(atPath: "/tmp/\(entry)")
        }
    }
}

nonisolated(unsafe) private var clusterToStop: String?

private func registerStopAtExit(dataDirectory: String, binDirectory: String?) {
    clusterToStop = dataDirectory
    atexit {
        if let directory = clusterToStop {
            stopClusterSynchronously(dataDirectory: directory)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }
}

/// `pg_ctl stop` without async machinery, for exit handlers.
func stopClusterSynchronously(dataDirectory: String) {
    let pgdata = dataDirectory + "/pgdata"
    guard FileManager.default.fileExists(atPath: pgdata + "/postmaster.pid") else { return }
    let binaries = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql"))?.sorted { (Int($0) ?? 0) > (Int($1) ?? 0) }
    let pgctl = binaries?.first.map { "/usr/lib/postgresql/\($0)/bin/pg_ctl" } ?? "pg_ctl"
    let environment = ProcessInfo.processInfo.environment
    let child: ChildProcess?
    if geteuid() == 0 {
        let owner = (try? FileManager.default.attributesOfItem(atPath: pgdata)[.ownerAccountName] as? String) ?? "postgres"
        child = try? Subprocess.start("/usr/sbin/runuser", ["-u", owner, "--", pgctl, "stop", "-D", pgdata, "-m", "immediate", "-w"], environment: environment)
    } else {
        child = try? Subprocess.start(pgctl, ["stop", "-D", pgdata, "-m", "immediate", "-w"], environment: environment)
    }
    _ = child?.waitBlocking()
}

/// A throwaway cluster of one test's own, migrated, which the test may stop and start (an
/// outage) without touching the shared one; `remove()` deletes it once stopped.
package struct OwnCluster: Sendable {
    package let cluster: EmbeddedPostgres
    package let database: PostgresClient.Configuration
    package let directory: String

    /// `settings`: postgresql.conf settings (e.g. autovacuum off, so that `pg_stat_database`
    /// counts the service alone).
    package static func start(label: String, settings: [String: String] = [:]) async throws -> OwnCluster {
        let directory = "/tmp/siwa-\(UUID().uuidString.prefix(8).lowercased())"
        let cluster = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false, extraSettings: settings), logger: Logger(label: label))
        let connection = try await cluster.start()
        let database = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database)
        let client = PostgresClient(configuration: database)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            try await Migrator(client: client, logger: Logger(label: label)).migrate()
            group.cancelAll()
        }
        return OwnCluster(cluster: cluster, database: database, directory: directory)
    }

    package func remove() { try? FileManager.default.removeItem(atPath: directory) }

    /// DATABASE_URL for the service role, over the unix socket.
    package var url: String {
        let socket = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        return "postgres://\(database.username)@/\(database.database ?? "")?host=\(socket)"
    }

    /// Stops the cluster, then removes it.
    package func stopAndRemove() async {
        try? await cluster.stop()
        remove()
    }
}
