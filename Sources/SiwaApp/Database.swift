import Foundation
import Logging
import PostgresNIO
import SiwaApple
import SiwaEmbeddedPostgres
import SiwaDomain
import SiwaRuntime
import SiwaStore
import UnixSignals

extension NotificationStore: KeySetPersistence {}

/// The database a process uses: `DATABASE_URL`, or the embedded cluster under `SIWA_DATA_DIR`
/// (attached to when `serve` already runs it, started for the command otherwise).
package struct Database: Sendable {
    package let client: PostgresClient
    package let embedded: EmbeddedPostgres?
    package let startedEmbedded: Bool
    /// DATABASE_URL's TCP hosts, which the pool reaches through it.
    package let relay: DatabaseRelay?
    package let description: String

    /// `serving`: a long-running `serve` process, whose pool runs without keep-alive timers (see
    /// `tuneForServing`); one-shot commands open connections as they need them, after one bounded
    /// attempt that names DATABASE_URL when it fails. `creating`: may start a new embedded cluster
    /// (`serve`, `migrate`); other commands name where they looked instead.
    package static func open(_ settings: DatabaseSettings, logger: Logger, serving: Bool = false, creating: Bool = false) async throws -> Database {
        if let url = settings.url {
            let target: DatabaseURL.Target
            do {
                target = try DatabaseURL.target(url)
            } catch {
                throw ConfigurationError(variable: "DATABASE_URL", message: error.description)
            }
            if !serving {
                switch await DatabaseProbe.probe(url, timeout: commandConnectTimeout, logger: logger) {
                case .reachable: break
                case .refused(let reason): throw refused(url, reason)
                case .unreachable(let reason): throw DatabaseUnreachable(url: DatabaseURL.redacted(url), reason: reason)
                }
            }
            var configuration: PostgresClient.Configuration
            var relay: DatabaseRelay?
            switch target.place {
            case .socket(let path):
                configuration = .init(unixSocketPath: path, username: target.username, password: target.password, database: target.database)
            case .hosts(let hosts, let tls):
                let started = try DatabaseRelay(hosts: hosts, tls: tls, attributes: target.sessionAttributes, logger: logger)
                try await started.start()
                relay = started
                configuration = .init(unixSocketPath: started.socketPath, username: target.username, password: target.password, database: target.database)
            }
            configuration.options.maximumConnections = settings.poolSize
            if serving { configuration.options.tuneForServing() }
            return Database(
                client: PostgresClient(configuration: configuration, backgroundLogger: logger), embedded: nil, startedEmbedded: false, relay: relay,
                description: DatabaseURL.redacted(url))
        }
        guard settings.embedded else { throw DatabaseSettings.noDatabase }
        let embedded = EmbeddedPostgres(
            options: .init(dataDirectory: settings.dataDirectory, durable: true, binDirectory: settings.postgresBinaries, extraSettings: ["max_connections": "\(max(100, settings.poolSize * 2 + 10))"]),
            logger: logger)
        guard creating || embedded.clusterExists else {
            throw ConfigurationError(
                variable: "DATABASE_URL",
                message: "is not set, and there is no embedded database in \(embedded.clusterDirectory): set DATABASE_URL=postgres://user:password@host:5432/db, or run this from the directory where `siwa-events serve` runs (or set SIWA_DATA_DIR to its .siwa directory); `siwa-events serve` creates the embedded database on first start")
        }
        let connection = try await embedded.start()
        logger.notice(
            "EMBEDDED POSTGRESQL IN USE — data in \(settings.dataDirectory); set DATABASE_URL for production",
            metadata: ["data_dir": "\(settings.dataDirectory)", "socket": "\(connection.socketPath)", "started": "\(connection.startedByUs)"])
        var configuration = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database)
        configuration.options.maximumConnections = settings.poolSize
        if serving { configuration.options.tuneForServing() }
        return Database(
            client: PostgresClient(configuration: configuration, backgroundLogger: logger), embedded: embedded,
            startedEmbedded: connection.startedByUs, relay: nil, description: "embedded PostgreSQL in \(settings.dataDirectory)")
    }

    /// Stops the relay, and the embedded cluster if this process started it.
    package func close() async {
        await relay?.stop()
        if startedEmbedded, let embedded {
            try? await embedded.stop()
        }
    }

    /// Runs `body` with the client running, then closes. For CLI commands.
    package static func with<T: Sendable>(
        _ settings: DatabaseSettings, logger: Logger, creating: Bool = false, _ body: @Sendable (Database) async throws -> T
    ) async throws -> T {
        let database = try await open(settings, logger: logger, creating: creating)
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

extension Database {
    /// How long a one-shot command tries to reach DATABASE_URL before saying it cannot.
    static let commandConnectTimeout: Duration = .seconds(5)

    /// `serve` on DATABASE_URL: waits until the database lets us in, retrying (with a warning
    /// naming DATABASE_URL) only what may heal; a refusal (authentication, unknown role or
    /// database) is a configuration error at once. False when SIGTERM/SIGINT came first.
    package static func waitUntilReachable(_ settings: DatabaseSettings, logger: Logger) async throws(ConfigurationError) -> Bool {
        guard let url = settings.url else { return true }
        let stop = Doorbell()
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        let watcher = Task {
            for await _ in signals {
                stop.close()
                return
            }
        }
        defer { watcher.cancel() }
        var delay: Duration = .seconds(1)
        while true {
            switch await DatabaseProbe.probe(url, timeout: .seconds(5), logger: logger) {
            case .reachable:
                return true
            case .refused(let reason):
                throw refused(url, reason)
            case .unreachable(let reason):
                logger.warning(
                    "cannot reach the database DATABASE_URL names; retrying",
                    metadata: ["database": "\(DatabaseURL.redacted(url))", "error": "\(reason)", "retry_in": "\(DurationSyntax.format(delay))"])
            }
            await stop.wait(timeout: delay)
            if stop.isClosed { return false }
            delay = min(delay * 2, .seconds(10))
        }
    }

    static func refused(_ url: String, _ reason: String) -> ConfigurationError {
        ConfigurationError(
            variable: "DATABASE_URL",
            message: "\(DatabaseURL.redacted(url)) refused us: \(reason); fix the user, password or database name in DATABASE_URL (or create them on the server)")
    }
}

/// A one-shot command could not reach DATABASE_URL's database (exit 69, EX_UNAVAILABLE).
package struct DatabaseUnreachable: Error, CustomStringConvertible {
    package let url: String
    package let reason: String
    package var description: String { "DATABASE_URL: cannot reach \(url): \(reason); is PostgreSQL running there, and is DATABASE_URL right?" }
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
