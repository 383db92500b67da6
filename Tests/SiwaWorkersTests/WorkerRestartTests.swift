import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

@Suite("Effect workers and a PostgreSQL restart", .timeLimit(.minutes(10)))
struct WorkerRestartTests {
    @Test("Workers reconnect after PostgreSQL restarts and finish the queue without a process restart")
    func postgresRestart() async throws {
        let directory = "/tmp/siwa-q-\(UUID().uuidString.prefix(6).lowercased())"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false), logger: Logger(label: "restart"))
        let connection = try await cluster.start()
        let configuration = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database)
        let client = PostgresClient(configuration: configuration)
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        var workerConfiguration = EffectWorkers.Configuration()
        workerConfiguration.effects.batchSize = 20
        // Batches in hand when PostgreSQL goes away roll back with its connections: their jobs are
        // ready again as soon as it is back (no lease to wait out).
        workerConfiguration.upkeep.interval = .milliseconds(500)
        let workers = EffectWorkers(configuration: workerConfiguration, store: EffectStore(client: client, logger: logger), logger: logger)
        // As in production: the client is a service of the same group, stopped last; the workers
        // start once the jobs are there and locked (below).
        let start = StartGate()
        let services = ServiceGroup(configuration: .init(services: [client, GatedService(gate: start, service: workers)], logger: logger))
        let task = Task { try await services.run() }
        try await Migrator(client: client, logger: logger).migrate()
        try await BulkLoad.notifications(count: 2_000, users: 200, aud: "com.example.app", client: client)
        // The workers' claims wait behind a lock until PostgreSQL stops: every job is still to do
        // then, and batches are in hand (blocked) when their connections go.
        // (The raw client: this call stops PostgreSQL under its own connection, which a bounded
        // call answers as closed.)
        let pending = try await client.withConnection { connection in
            try await connection.query("BEGIN", logger: logger)
            try await connection.query("LOCK TABLE jobs IN SHARE MODE", logger: logger)
            var pending = 0
            for try await (n,) in try await connection.query("SELECT count(*) FROM jobs WHERE state = 'available'", logger: logger).decode((Int,).self) {
                pending = n
            }
            start.open()
            try await cluster.stop()
            return pending
        }
        #expect(pending == 2_000, "every job still to do when PostgreSQL stopped")
        _ = try await cluster.start()
        // The running workers find the database again by themselves (bounded: 120 s); each batch
        // they apply NOTIFYs siwa_effects.
        let done = try await DatabaseEvents.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed'", reaches: 2_000, within: .seconds(120))
        #expect(done == 2_000, "the workers completed \(done) of 2000 jobs within 120 s of PostgreSQL's restart")
        var applied = 0
        for try await (n,) in try await client.bounded.query("SELECT count(*) FROM job_attempts WHERE outcome = 'applied'", logger: logger).decode((Int,).self) { applied = n }
        #expect(applied == 2_000)
        await services.triggerGracefulShutdown()
        _ = await task.result
        try await cluster.stop()
    }
}
