import Foundation
import Logging
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaKeys
import SiwaStore

extension NotificationStore: KeySetPersistence {}

/// The database a process uses: `DATABASE_URL`, or the embedded cluster under `SIWA_DATA_DIR`
/// (attached to when `serve` already runs it, started for the command otherwise).
package struct Database: Sendable {
    package let client: PostgresClient
    package let embedded: EmbeddedPostgres?
    package let startedEmbedded: Bool
    package let description: String

    /// `serving`: a long-running `serve` process, whose pool runs without keep-alive timers (see
    /// `tuneForServing`); one-shot commands open connections as they need them.
    package static func open(_ config: Configuration, logger: Logger, serving: Bool = false) async throws -> Database {
        if let url = config.database.url {
            var configuration: PostgresClient.Configuration
            do {
                configuration = try DatabaseURL.configuration(url)
            } catch {
                throw ConfigurationError(variable: "DATABASE_URL", message: error.description)
            }
            configuration.options.maximumConnections = config.database.poolSize
            if serving { configuration.options.tuneForServing() }
            return Database(
                client: PostgresClient(configuration: configuration, backgroundLogger: logger), embedded: nil, startedEmbedded: false,
                description: DatabaseURL.redacted(url))
        }
        guard config.database.embedded else {
            throw ConfigurationError(variable: "DATABASE_URL", message: "is not set and SIWA_EMBEDDED_DATABASE=off: set DATABASE_URL=postgres://user:password@host:5432/db (a deployment never starts a private database)")
        }
        let embedded = EmbeddedPostgres(
            options: .init(dataDirectory: config.database.dataDirectory, durable: true, binDirectory: config.database.postgresBinaries, extraSettings: ["max_connections": "\(max(100, config.database.poolSize * 2 + 10))"]),
            logger: logger)
        let connection = try await embedded.start()
        logger.notice(
            "EMBEDDED POSTGRESQL IN USE — data in \(config.database.dataDirectory); set DATABASE_URL for production",
            metadata: ["data_dir": "\(config.database.dataDirectory)", "socket": "\(connection.socketPath)", "started": "\(connection.startedByUs)"])
        var configuration = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database)
        configuration.options.maximumConnections = config.database.poolSize
        if serving { configuration.options.tuneForServing() }
        return Database(
            client: PostgresClient(configuration: configuration, backgroundLogger: logger), embedded: embedded,
            startedEmbedded: connection.startedByUs, description: "embedded PostgreSQL in \(config.database.dataDirectory)")
    }

    /// Stops the embedded cluster if this process started it.
    package func close() async {
        if startedEmbedded, let embedded {
            try? await embedded.stop()
        }
    }

    /// Runs `body` with the client running, then closes. For CLI commands.
    package static func with<T: Sendable>(_ config: Configuration, logger: Logger, _ body: @Sendable (Database) async throws -> T) async throws -> T {
        let database = try await open(config, logger: logger)
        do {
            let result = try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await database.client.run() }
                defer { group.cancelAll() }
                return try await body(database)
            }
            await database.close()
            return result
        } catch {
            await database.close()
            throw error
        }
    }
}

extension PostgresClient.Configuration.Options {
    /// The pool as a long-running server needs it: no keep-alive and a 5 s idle timeout, because
    /// postgres-nio's timers are `Task.sleep`s re-armed per query and a cancelled sleep holds its
    /// task until its deadline (memory grew with rate × timeout; BENCHMARKS.md, "Soak").
    /// `minimumConnections` stays 0: postgres-nio 1.33 asserts when fewer are open, which is the
    /// state a database restart leaves it in.
    mutating func tuneForServing() {
        minimumConnections = 0
        connectionIdleTimeout = .seconds(5)
        keepAliveBehavior = nil
    }
}
