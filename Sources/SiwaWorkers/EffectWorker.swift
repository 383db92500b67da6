import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// What one effect round did.
package struct EffectRound: Sendable, Equatable {
    /// Jobs claimed (0: nothing was ready).
    package var claimed = 0
    /// Jobs whose effects were applied.
    package var applied = 0
    /// The batch failed and its jobs were then run one by one.
    package var oneByOne = false

    package init(claimed: Int = 0, applied: Int = 0, oneByOne: Bool = false) {
        self.claimed = claimed
        self.applied = applied
        self.oneByOne = oneByOne
    }
}

/// One effect worker: claims a batch of ready jobs (one per user at most), applies their effects
/// and completes them — claim included, one transaction (`EffectStore.runBatch`) — and claims
/// again; idle, it waits for its doorbell (a `siwa_jobs` NOTIFY, a local enqueue, a rescue) or
/// the poll interval. A worker that dies mid-batch leaves nothing behind: the transaction rolls
/// back. Graceful shutdown abandons a batch still running (it commits or rolls back whole).
package final class EffectWorker: Service, Sendable {
    /// What an effect worker reads.
    package struct Configuration: Sendable {
        package var batchSize: Int
        package var lease: Duration
        package var pollInterval: Duration
        /// Whether the listener wakes idle workers (nil: they poll).
        package var listening: ListenState?
        package var retry: RetryPolicy
        package var eraseOnDelete: Bool
        /// Each applied effect also enqueues its callback (lane `callbacks`).
        package var callbacks: Bool
        /// What a revoking event does with the user's kept Apple tokens.
        package var appleTokens: KeptTokensOnAppleEvent = .forget
        /// What the effects do for suppressions (the feed always; jobs for each provider).
        package var suppressions = SuppressionOptions()
    }

    package let name: String
    let configuration: Configuration
    let store: EffectStore
    let doorbell: Doorbell
    /// Rung when effects were applied and callbacks are configured.
    let callbackDoorbell: Doorbell?
    let logger: Logger
    let metrics: WorkerMetrics?
    /// The process's effect workers together: who claims when one is mid-round.
    let crew: EffectCrew

    init(
        name: String, configuration: Configuration, store: EffectStore, doorbell: Doorbell, callbackDoorbell: Doorbell?, logger: Logger,
        metrics: WorkerMetrics?, crew: EffectCrew
    ) {
        self.name = name
        self.configuration = configuration
        self.store = store
        self.doorbell = doorbell
        self.callbackDoorbell = callbackDoorbell
        self.logger = logger
        self.metrics = metrics
        self.crew = crew
    }

    package func run() async throws {
        await Scheduler.run(
            Schedule(interval: configuration.pollInterval, doorbell: doorbell), once: { try await self.round() },
            pace: { [configuration] in $0 ? .again : .idleFor(configuration.listening?.idleWait(poll: configuration.pollInterval) ?? configuration.pollInterval) }
        ) { error in
            logger.warning("worker: database error; retrying", metadata: ["worker": "\(name)", "error": "\(loggable(error))"])
        }
    }

    /// One turn of the run loop: a claim, unless another worker is mid-round and will take the
    /// jobs in its next claim (`EffectCrew`). Whether to claim again at once.
    private func round() async throws -> Bool {
        guard crew.begin() else { return false }
        do {
            let claimed = try await runOnce().claimed
            // A full batch is a backlog: wake an idle peer, which wakes the next if it finds one too.
            if claimed >= configuration.batchSize { doorbell.ring() }
            return crew.end(claimed: claimed)
        } catch {
            crew.abandon()
            throw error
        }
    }

    private var stopping: Bool { Task.isCancelled || Task.isShuttingDownGracefully }

    /// Claims one batch and applies it, in one transaction. On graceful shutdown a batch still
    /// running is abandoned, not waited for: its transaction either commits whole or rolls back
    /// whole (the jobs then wait for the next claim, no attempt spent) — and one that never
    /// answers (a statement lost at a database restart, see `BoundedPostgres`) cannot hold SIGTERM.
    /// `now`: the time the batch is claimed at (nil: PostgreSQL's; tests pass theirs to be past a backoff).
    @discardableResult
    package func runOnce(now: Date? = nil) async throws -> EffectRound {
        let started = ContinuousClock.now
        let round: EffectStore.Round
        do {
            round = try await cancelWhenGracefulShutdown {
                try await self.store.runBatch(
                    worker: self.name, limit: self.configuration.batchSize, eraseOnDelete: self.configuration.eraseOnDelete,
                    callbacks: self.configuration.callbacks, appleTokens: self.configuration.appleTokens,
                    suppressions: self.configuration.suppressions, lease: self.configuration.lease, now: now)
            }
        } catch let failed as EffectStore.BatchFailed {
            // One bad job must not hold back its batch: its jobs one by one.
            logger.warning(
                "batch failed; applying its jobs one by one",
                metadata: ["worker": "\(name)", "size": "\(failed.jobs.count)", "error": "\(loggable(failed.underlying))"])
            var result = EffectRound(claimed: failed.jobs.count, oneByOne: true)
            for job in failed.jobs where !stopping {
                // Not recorded (the connection or the server failed): the rest would fail alike.
                guard let applied = await runOne(job) else { break }
                if applied { result.applied += 1 }
            }
            return result
        }
        guard !round.claimed.isEmpty else { return EffectRound() }
        if !round.applied.isEmpty { callbackDoorbell?.ring() }
        let elapsed = ContinuousClock.now - started
        logApplied(round.applied, batch: round.claimed.count, elapsed: elapsed)
        return EffectRound(claimed: round.claimed.count, applied: round.applied.count)
    }

    /// One job of a failed batch, on its own: applied (true), or its failed attempt recorded
    /// (false). Nil when neither could be done (the job is left ready for the next claim).
    private func runOne(_ job: ClaimedJob) async -> Bool? {
        let started = ContinuousClock.now
        let (store, configuration, worker) = (self.store, self.configuration, self.name)
        do {
            let outcome = try await cancelWhenGracefulShutdown {
                try await store.runOne(
                    job, worker: worker, eraseOnDelete: configuration.eraseOnDelete, callbacks: configuration.callbacks, appleTokens: configuration.appleTokens,
                    suppressions: configuration.suppressions,
                    maxAttempts: configuration.retry.maxAttempts, lease: configuration.lease
                ) { attempt in configuration.retry.backoff.delay(attempt: attempt, unit: Double.random(in: 0..<1)) }
            }
            let elapsed = ContinuousClock.now - started
            switch outcome {
            case .applied(let effect):
                callbackDoorbell?.ring()
                logApplied([effect], batch: 1, elapsed: elapsed)
                return true
            case .failed(let error, let discarded):
                let result = discarded ? "discarded" : "retrying"
                metrics?.attempt(lane: Lane.effects.rawValue, outcome: result, took: elapsed)
                logger.warning(
                    "job",
                    metadata: ["outcome": "\(result)", "job_id": "\(job.id)", "jti": "\(job.jti)", "attempt": "\(job.attempt)", "error": "\(error)", "worker": "\(worker)"])
            case .gone:
                logger.debug("job taken by another worker meanwhile", metadata: ["job_id": "\(job.id)", "worker": "\(worker)"])
            }
            return false
        } catch {
            if stopping { return nil }
            logger.warning(
                "job",
                metadata: [
                    "outcome": "not_recorded", "job_id": "\(job.id)", "jti": "\(job.jti)", "attempt": "\(job.attempt)", "worker": "\(worker)",
                    "error": "\(loggable(error))", "next": "rolled back; ready for the next claim",
                ])
            return nil
        }
    }

    /// The log line of each applied effect of a batch, and their metrics (counted per batch).
    private func logApplied(_ effects: [AppliedEffect], batch: Int, elapsed: Duration) {
        metrics?.applied(effects, took: elapsed)
        let (worker, size): (Logger.MetadataValue, Logger.MetadataValue) = ("\(name)", "\(batch)")
        let batchMillis: Logger.MetadataValue = "\(Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000 + Double(elapsed.components.seconds) * 1000)"
        for effect in effects {
            logger.info(
                "job",
                metadata: [
                    "outcome": "applied", "job_id": "\(effect.jobID)", "jti": "\(effect.jti)", "aud": "\(effect.aud)", "type": "\(effect.type)",
                    "effect": "\(effect.effect)", "revoked_sessions": "\(effect.revokedSessions)", "worker": worker, "batch": size, "batch_ms": batchMillis,
                ])
        }
    }
}
