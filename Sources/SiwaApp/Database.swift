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
    /// The pool as a long-running server needs it.
    ///
    /// postgres-nio arms an idle-timeout timer (and a keep-alive timer) each time a connection goes
    /// back to the pool, and cancels it when the connection is leased again: once per query. A
    /// cancelled `Task.sleep` keeps its task allocated (≈ 2 KB) until the sleep's original deadline
    /// passes, so the memory a busy process holds is rate × timeout: with the 60 s default,
    /// ≈ 1,000 releases/s held > 100 MB (the 10-minute soak grew 97 → 164 MiB). So: no keep-alive
    /// (a connection that died while idle is found at its next use: that statement fails, the pool
    /// replaces the connection, the caller's usual error path runs — a 503 Apple retries, a batch
    /// retried) and a 5 s idle timeout (a busy process keeps its connections warm; an idle one
    /// closes them, then reconnects in milliseconds).
    ///
    /// `minimumConnections` stays 0: postgres-nio 1.33 asserts (and crashes the process) when a
    /// query finds no idle connection while fewer than `minimumConnections` are open, which is the
    /// state a database restart leaves it in (it gives up on all but one reconnection attempt).
    mutating func tuneForServing() {
        minimumConnections = 0
        connectionIdleTimeout = .seconds(5)
        keepAliveBehavior = nil
    }
}
