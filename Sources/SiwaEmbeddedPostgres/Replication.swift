import Foundation

/// A primary and its streaming standby on one machine, for failover tests: a standby made by
/// `pg_basebackup`, promoted with `pg_ctl promote`, and a primary lost with `-m immediate`.
extension EmbeddedPostgres {
    /// A standby of this running cluster under `dataDirectory` (`pg_basebackup -R`, WAL
    /// streamed), named `name` to the primary (`synchronous_standby_names`); `start()` starts it.
    package func makeStandby(dataDirectory: String, name: String) async throws -> EmbeddedPostgres {
        let cluster = try await existingCluster()
        let standby = try ClusterLayout(dataDirectory: dataDirectory, port: Self.port)
        try FileSystem.createDirectoryTree(standby.dataDirectory)
        try cluster.account.takeOwnership(of: standby.dataDirectory)
        let result = try await cluster.run(.pgBasebackup, [
            "-D", standby.pgdata, "-h", cluster.layout.socketDirectory, "-p", "\(Self.port)", "-U", Self.superuser,
            "-R", "-X", "stream", "-c", "fast", "-d", "application_name=\(name)",
        ])
        guard result.succeeded else { throw EmbeddedPostgresError.stopFailed(pgdata: standby.pgdata, output: "pg_basebackup: \(result.combinedOutput)") }
        return EmbeddedPostgres(
            options: .init(dataDirectory: dataDirectory, durable: options.durable, database: options.database, binDirectory: options.binDirectory, extraSettings: options.extraSettings),
            logger: logger)
    }

    /// `pg_ctl promote -w`: a standby becomes a primary.
    package func promote() async throws {
        let cluster = try await existingCluster()
        let result = try await cluster.run(.pgCtl, ["promote", "-D", cluster.layout.pgdata, "-w", "-t", "60"])
        guard result.succeeded else { throw EmbeddedPostgresError.stopFailed(pgdata: cluster.layout.pgdata, output: result.combinedOutput) }
    }

    /// `pg_ctl stop -m immediate`: the server ends at once, as if its host were lost.
    package func stopImmediately() async throws {
        let cluster = try await existingCluster()
        let result = try await cluster.run(.pgCtl, ["stop", "-D", cluster.layout.pgdata, "-m", "immediate", "-w", "-t", "60"])
        guard result.succeeded else { throw EmbeddedPostgresError.stopFailed(pgdata: cluster.layout.pgdata, output: result.combinedOutput) }
    }

    private func existingCluster() async throws -> Cluster {
        let layout = try ClusterLayout(dataDirectory: options.dataDirectory, port: Self.port)
        let binaries = try PostgresBinaries.locate(explicit: options.binDirectory, environment: ProcessInfo.processInfo.environment)
        return Cluster(layout: layout, binaries: binaries, account: try ClusterAccount.forExistingCluster(pgdata: layout.pgdata), logger: logger)
    }
}
