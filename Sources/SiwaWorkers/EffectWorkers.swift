import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaDomain
import SiwaStore

/// The worker loops that turn recorded notifications into effects on accounts and sessions.
///
/// Each loop claims a batch of ready jobs (one per user at most, see `EffectStore.claim`), applies
/// their effects and completes them in one transaction, and claims again; when nothing is ready it
/// sleeps until a `siwa_jobs` NOTIFY or the poll interval. Beside the loops: a listener for that
/// NOTIFY, a heartbeat renewing the leases of held jobs, and maintenance (rescue of jobs whose
/// worker died, pruning of finished jobs). Graceful shutdown: stop claiming, finish the batch in
/// hand, release anything still held.
package final class EffectWorkers: Service, Sendable {
    package struct Configuration: Sendable {
        package var workers = 4
        package var batchSize = 200
        package var lease: Duration = .seconds(15)
        package var pollInterval: Duration = .milliseconds(100)
        package var maxAttempts = 25
        package var backoff = RetryBackoff()
        package var eraseOnDelete = true
        package var retention: Duration = .seconds(7 * 86_400)
        /// LISTEN for `siwa_jobs` (off: poll only, e.g. behind a transaction-mode pooler).
        package var listen = true
        package var maintenanceInterval: Duration = .seconds(5)

        package init() {}
    }

    package let configuration: Configuration
    let store: EffectStore
    let logger: Logger
    let doorbell = Doorbell()
    /// This process's workers are `<identity>/<n>`.
    package let identity: String

    package init(configuration: Configuration, store: EffectStore, logger: Logger, identity: String = EffectWorkers.defaultIdentity()) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
        self.identity = identity
    }

    package static func defaultIdentity() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UUID().uuidString.prefix(6))"
    }

    package func workerName(_ index: Int) -> String { "\(identity)/\(index)" }

    package func run() async throws {
        logger.info("effect workers starting", metadata: ["workers": "\(configuration.workers)", "identity": "\(identity)"])
        await withDiscardingTaskGroup { helpers in
            helpers.addTask { await self.heartbeats() }
            helpers.addTask { await self.maintenance() }
            if configuration.listen {
                helpers.addTask { await self.listen() }
            }
            // The loops end on graceful shutdown, each after the batch in hand; then the helpers go.
            await withGracefulShutdownHandler {
                await withDiscardingTaskGroup { loops in
                    for index in 0..<configuration.workers {
                        loops.addTask { await self.loop(worker: self.workerName(index)) }
                    }
                }
            } onGracefulShutdown: {
                self.doorbell.ringAll()
            }
            helpers.cancelAll()
        }
        // Graceful shutdown stops the workers before the database client (service order), so
        // what is still held can be handed back. When cancelled outright, the client may be gone
        // already: leave it to the lease. Either way never wait on the database for long.
        if !Task.isCancelled {
            let store = self.store
            for index in 0..<configuration.workers {
                let worker = workerName(index)
                let released = (try? await withDeadline(.seconds(5)) { try await store.release(worker: worker) }) ?? 0
                if released > 0 { logger.info("released jobs on shutdown", metadata: ["worker": "\(worker)", "count": "\(released)"]) }
            }
        }
        logger.info("effect workers stopped", metadata: ["identity": "\(identity)"])
    }

    private var stopping: Bool { Task.isCancelled || Task.isShuttingDownGracefully }

    private func loop(worker: String) async {
        while !stopping {
            do {
                let processed = try await runOnce(worker: worker)
                if processed == 0 { await doorbell.wait(timeout: configuration.pollInterval) }
            } catch {
                logger.warning("effect worker: database error; retrying", metadata: ["worker": "\(worker)", "error": "\(loggable(error))"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Claims one batch and applies it. Returns how many jobs it claimed (0: nothing ready).
    @discardableResult
    package func runOnce(worker: String) async throws -> Int {
        let jobs = try await store.claim(worker: worker, limit: configuration.batchSize, lease: configuration.lease)
        guard !jobs.isEmpty else { return 0 }
        await process(jobs, worker: worker)
        return jobs.count
    }

    private func process(_ jobs: [ClaimedJob], worker: String) async {
        let started = ContinuousClock.now
        do {
            let applied = try await store.apply(jobs, worker: worker, eraseOnDelete: configuration.eraseOnDelete)
            let elapsed = ContinuousClock.now - started
            for effect in applied {
                logger.info(
                    "job",
                    metadata: [
                        "outcome": "applied", "job_id": "\(effect.jobID)", "jti": "\(effect.jti)", "aud": "\(effect.aud)", "type": "\(effect.type)",
                        "effect": "\(effect.effect)", "revoked_sessions": "\(effect.revokedSessions)", "worker": "\(worker)",
                        "batch": "\(jobs.count)", "batch_ms": "\(Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000 + Double(elapsed.components.seconds) * 1000)",
                    ])
            }
            if applied.count < jobs.count {
                logger.warning("jobs no longer held at completion (taken over after their lease)", metadata: ["worker": "\(worker)", "count": "\(jobs.count - applied.count)"])
            }
        } catch where jobs.count > 1 {
            // One bad job must not hold back its batch: apply them one by one.
            logger.warning("batch failed; applying its jobs one by one", metadata: ["worker": "\(worker)", "size": "\(jobs.count)", "error": "\(loggable(error))"])
            for job in jobs { await process([job], worker: worker) }
        } catch {
            let message = loggable(error)
            for job in jobs {
                logger.warning(
                    "job", metadata: ["outcome": job.attempt >= configuration.maxAttempts ? "discarded" : "retrying", "job_id": "\(job.id)", "jti": "\(job.jti)", "attempt": "\(job.attempt)", "error": "\(message)", "worker": "\(worker)"])
            }
            do {
                let backoff = configuration.backoff
                try await store.fail(jobs, worker: worker, error: message, maxAttempts: configuration.maxAttempts) { attempt in
                    backoff.delay(attempt: attempt, unit: Double.random(in: 0..<1))
                }
            } catch {
                logger.warning("could not record the failure; the lease will expire and the job be retried", metadata: ["error": "\(loggable(error))"])
            }
        }
    }

    private func heartbeats() async {
        let every = configuration.lease / 3
        while !stopping {
            try? await Task.sleep(for: every)
            for index in 0..<configuration.workers {
                try? await store.heartbeat(worker: workerName(index), lease: configuration.lease)
            }
        }
    }

    private func maintenance() async {
        var lastPrune = ContinuousClock.now - .seconds(3600)
        while !stopping {
            do {
                let rescued = try await store.rescueExpiredLeases(maxAttempts: configuration.maxAttempts)
                if rescued > 0 {
                    logger.warning("rescued jobs whose worker stopped renewing its lease", metadata: ["count": "\(rescued)"])
                    doorbell.ring()
                }
                if ContinuousClock.now - lastPrune > .seconds(60) {
                    lastPrune = ContinuousClock.now
                    let pruned = try await store.prune(retention: configuration.retention)
                    if pruned > 0 { logger.info("pruned finished jobs", metadata: ["count": "\(pruned)"]) }
                }
            } catch {
                logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
            }
            try? await Task.sleep(for: configuration.maintenanceInterval)
        }
    }

    /// LISTEN siwa_jobs on one pooled connection; rings the doorbell on each NOTIFY. Reconnects
    /// after errors (database restart); workers poll meanwhile.
    private func listen() async {
        while !stopping {
            do {
                try await store.client.withConnection { connection in
                    try await connection.listen(on: "siwa_jobs") { notifications in
                        self.doorbell.ring()  // catch up on anything enqueued before LISTEN took effect
                        for try await _ in notifications {
                            self.doorbell.ring()
                        }
                    }
                }
            } catch {
                if stopping { return }
                logger.debug("LISTEN siwa_jobs interrupted; reconnecting", metadata: ["error": "\(loggable(error))"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }
}
