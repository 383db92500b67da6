import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// An effect job held by a worker, with the event it applies.
package struct ClaimedJob: Sendable {
    package var id: Int
    package var attempt: Int
    package var notificationID: Int
    package var jti: String
    package var aud: String
    package var event: AppleEvent
    package var claimedAt: Date

    /// The job as the effect planner reads it.
    package var planned: EffectJob { EffectJob(id: id, jti: jti, aud: aud, event: event) }
}

extension ClaimedJob {
    /// A row of a claim: job id, attempt, notification id, jti, aud, sub, type, raw type, event
    /// time (ms), email, is_private_email, claimed at.
    init(claimed row: PostgresRow) throws {
        let r = try row.decode((Int, Int, Int, String, String, String, String, String, Int64, String?, Bool?, Date).self)
        self.init(
            id: r.0, attempt: r.1, notificationID: r.2, jti: r.3, aud: r.4,
            event: AppleEvent(rawType: r.7, type: EventType(apple: r.6), sub: r.5, eventTimeMillis: r.8, email: r.9, isPrivateEmail: r.10),
            claimedAt: r.11)
    }
}

/// The effects lane. Its jobs are claimed, applied and completed in the effect worker's one
/// transaction (`EffectStore.runBatch`): the claim and the failure record run on that
/// transaction's connection, and enqueue and completion are CTEs that the notification and effect
/// statements embed, so that ingest and a batch stay one round trip each.
extension JobQueue {
    package enum Effects {
        // MARK: JobsClaim

        /// The claim: up to `limit` ready effect jobs, each its user's earliest unfinished one,
        /// locked with `SKIP LOCKED`, with the events they apply — retries due at `now` (nil:
        /// PostgreSQL's `now()`) first, in run order, then available jobs in event order. The per-user gate is `siwa_effect_jobs_ahead`
        /// (sql/014), the query `siwa_claim_effects` (planned once per connection); this prepared
        /// statement adds the transaction's settings (`transactionSettingsSQL`).
        package struct Claim: PostgresPreparedStatement {
            package static let name = "siwa_effects_claim_v2"
            package static let sql = """
                WITH claimed AS MATERIALIZED (
                    SELECT * FROM siwa_claim_effects($1::integer, coalesce($3::timestamptz, now()))
                )
                \(Effects.transactionSettingsSQL(from: "claimed", lease: "$2::text"))
                SELECT c.job_id, c.attempt, c.notification_id, c.jti, c.aud, c.sub, c.type, c.raw_type, c.event_time_ms, c.email,
                    c.is_private_email, now()
                FROM claimed c, (SELECT count(*) FROM settings) s
                ORDER BY c.job_id
                """
            package typealias Row = ClaimedJob
            let limit: Int
            let lease: Duration
            let now: Date?

            package init(limit: Int, lease: Duration = EffectStore.defaultLease, now: Date? = nil) {
                precondition(limit > 0)
                self.limit = limit
                self.lease = lease
                self.now = now
            }

            package func makeBindings() -> PostgresBindings {
                var bindings = PostgresBindings(capacity: 3)
                bindings.append(limit)
                bindings.append(Effects.idleLimit(lease))
                bindings.append(now)
                return bindings
            }

            package func decodeRow(_ row: PostgresRow) throws -> ClaimedJob { try ClaimedJob(claimed: row) }
        }

        /// One job of a failed batch again, as it was claimed (same attempt count, still ready,
        /// still its user's earliest unfinished one: the same gate), locked.
        static func claimOne(id: Int, attempt: Int, lease: Duration, on connection: PostgresConnection, logger: Logger) async throws -> ClaimedJob? {
            let sql = """
                WITH candidates AS (
                    SELECT j.id, j.notification_id, j.attempt FROM jobs j
                    WHERE j.id = \(id) AND j.attempt = \(attempt) AND j.lane = 'effects' AND j.state IN ('available', 'retryable')
                      AND NOT EXISTS (SELECT FROM siwa_effect_jobs_ahead(j.aud, j.sub, j.event_time, j.id))
                    FOR UPDATE OF j SKIP LOCKED
                )
                \(transactionSettingsSQL(from: "candidates", lease: "'\(idleLimit(lease))'"))
                SELECT c.id, c.attempt + 1, n.id, n.jti, n.aud, n.sub, n.type, n.raw_type,
                    (extract(epoch FROM n.event_time) * 1000)::bigint, n.email, n.is_private_email, now()
                FROM candidates c JOIN notifications n ON n.id = c.notification_id, (SELECT count(*) FROM settings) s
                ORDER BY c.id
                """
            var job: ClaimedJob?
            for try await row in try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger) {
                job = try ClaimedJob(claimed: row)
            }
            return job
        }

        /// A CTE `settings` (`, settings AS (…)`, to follow the claim's) that, when the claim `from`
        /// found a job, sets for the rest of this transaction only (no job, no setting):
        /// - how long it may sit idle (`lease`, see `EffectStore.runBatch`);
        /// - how its statements are planned: by key, through indexes (no sequential scans, no hash
        ///   or merge joins), so that prepared statements planned on a fresh install's empty,
        ///   never-analyzed tables keep reading a backlog by key (BENCHMARKS.md).
        static func transactionSettingsSQL(from claim: String, lease: String) -> String {
            """
            , settings AS MATERIALIZED (
                SELECT set_config('idle_in_transaction_session_timeout', \(lease), true),
                    set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
                    set_config('enable_mergejoin', 'off', true)
                FROM \(claim) LIMIT 1
            )
            """
        }

        /// `lease` as an `idle_in_transaction_session_timeout` value.
        static func idleLimit(_ lease: Duration) -> String { "\(max(1, Int(lease.milliseconds)))ms" }

        // MARK: JobsEnqueue, JobsComplete, JobAttemptsInsert (CTEs of the callers' statements)

        /// Enqueues an effect job for each row of `relation` (id, aud, sub, event_time, status) whose
        /// notification is pending, in `order` (an ORDER BY list; nil: as the rows come).
        package static func enqueueSQL(from relation: String, order: String? = nil) -> String {
            """
            INSERT INTO jobs (notification_id, run_at, aud, sub, event_time)
            SELECT id, now(), aud, sub, event_time FROM \(relation) WHERE status = 'pending'\(order.map { " ORDER BY \($0)" } ?? "")
            """
        }

        /// Completes the claimed jobs of `input`, a relation aliased `c` with (id, attempt,
        /// started_at_us), if still ready (the claim's lock guarantees it); returns their ids.
        static func completeSQL(input: String) -> String {
            """
            UPDATE jobs j SET state = 'completed', attempt = c.attempt,
                attempted_at = timestamptz 'epoch' + c.started_at_us * interval '1 microsecond', finished_at = now(),
                locked_by = NULL, lease_expires_at = NULL
            FROM \(input)
            WHERE j.id = c.id AND j.state IN ('available', 'retryable')
            RETURNING j.id
            """
        }

        /// Logs an `applied` attempt for each row of `relation` (job_id, notification_id, attempt,
        /// started_at_us, effect), by `worker` (an SQL expression).
        static func logAppliedSQL(from relation: String, worker: String) -> String {
            """
            INSERT INTO job_attempts (job_id, notification_id, attempt, worker, started_at, outcome, effect)
            SELECT job_id, notification_id, attempt, \(worker), timestamptz 'epoch' + started_at_us * interval '1 microsecond',
                '\(AttemptOutcome.applied.rawValue)', effect::jsonb
            FROM \(relation)
            """
        }

        /// Enqueues a callback delivery for each row of `relation` (notification_id, aud, sub,
        /// event_ms, callback) with a callback body; returns the new jobs' ids.
        static func enqueueCallbacksSQL(from relation: String) -> String {
            """
            INSERT INTO jobs (notification_id, kind, lane, aud, sub, event_time, payload)
            SELECT notification_id, 'callback', '\(Lane.callbacks.rawValue)', aud, sub, timestamptz 'epoch' + event_ms * interval '1 millisecond', callback
            FROM \(relation) WHERE callback IS NOT NULL
            ON CONFLICT (notification_id, kind) DO NOTHING
            RETURNING id
            """
        }

        // MARK: JobsFail

        /// Records a failed attempt at a job this transaction holds: back to `retryable` after
        /// `delay`, or `discarded`; the notification shows `retrying` / `discarded`.
        static func fail(
            _ job: ClaimedJob, error: String, discarded: Bool, delay: Duration, worker: String, on connection: PostgresConnection, logger: Logger
        ) async throws {
            let delayMillis = Int(delay.milliseconds)
            let state = discarded ? JobState.discarded : .retryable
            let outcome = discarded ? AttemptOutcome.discarded : .retrying
            // Read to the end: a statement's error arrives with its rows.
            for try await _ in try await connection.query(
                """
                WITH failed AS (
                    UPDATE jobs j SET
                        state = \(state.rawValue)::job_state,
                        attempt = \(job.attempt), attempted_at = \(job.claimedAt),
                        run_at = now() + \(delayMillis) * interval '1 millisecond',
                        finished_at = CASE WHEN \(discarded) THEN now() END,
                        last_error = \(error), locked_by = NULL, lease_expires_at = NULL
                    WHERE j.id = \(job.id)
                    RETURNING j.id, j.notification_id, j.attempt, j.attempted_at, j.state
                )
                INSERT INTO job_attempts (job_id, notification_id, attempt, worker, started_at, outcome, error)
                SELECT id, notification_id, attempt, \(worker), attempted_at, \(outcome.rawValue), \(error)
                FROM failed
                RETURNING id
                """, logger: logger) {}
        }
    }

    // MARK: JobsRetry, JobsReplay, JobsList (effects)

    /// Puts effect jobs back in the queue: one by id, or every discarded one (optionally of one
    /// event type). Their notifications show `pending` again.
    @discardableResult
    package func retryEffects(jobID: Int?, discarded: Bool, type: String?) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH retried AS (
                UPDATE jobs j SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL,
                    locked_by = NULL, lease_expires_at = NULL
                FROM notifications n
                WHERE n.id = j.notification_id AND j.lane = 'effects' AND j.state <> 'running'
                  AND ((\(jobID)::bigint IS NOT NULL AND j.id = \(jobID)) OR (\(discarded) AND j.state = 'discarded'))
                  AND (\(type)::text IS NULL OR n.type = \(type))
                RETURNING j.notification_id
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger)
    }

    /// Enqueues a stored notification's effect again (idempotent: the rules make a second
    /// application a no-op). Returns false when no such notification has an effect to run.
    package func replayEffect(jti: String) async throws -> Bool {
        var replayed = false
        for try await (_,) in try await client.bounded.query(
            """
            WITH target AS (
                SELECT id, aud, sub, event_time FROM notifications
                WHERE jti = \(jti) AND type = ANY(\(EventType.allCases.map(\.rawValue))::text[])
                FOR KEY SHARE  -- the pruner's delete is waited for (then nothing is found); a batch's status update is not
            )
            INSERT INTO jobs (notification_id, aud, sub, event_time, run_at)
            SELECT id, aud, sub, event_time, now() FROM target
            ON CONFLICT (notification_id, kind) DO UPDATE SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL,
                last_error = NULL, locked_by = NULL, lease_expires_at = NULL
            WHERE jobs.state <> 'running'
            RETURNING id
            """, logger: logger
        ).decode((Int,).self) {
            replayed = true
        }
        if replayed { try await notify(.effects) }
        return replayed
    }

    /// An effect job as `jobs list` shows it.
    package struct EffectJobSummary: Sendable {
        package var id: Int
        package var state: JobState
        package var attempt: Int
        package var jti: String
        package var aud: String
        package var sub: String?
        package var type: String?
        package var runAt: Date
        package var createdAt: Date
        package var finishedAt: Date?
        package var lockedBy: String?
        package var lastError: String?
    }

    /// Newest first; optionally only those in `state`.
    package func listEffects(state: JobState?, limit: Int) async throws -> [EffectJobSummary] {
        var sql = SQLBuilder(
            """
            SELECT j.id, j.state::text, j.attempt, n.jti, n.aud, n.sub, n.type, j.run_at, j.created_at, j.finished_at, j.locked_by, j.last_error
            FROM jobs j JOIN notifications n ON n.id = j.notification_id
            """)
        sql.filter("j.lane =", Lane.effects.rawValue)
        sql.filter("j.state::text =", state?.rawValue)
        sql.append(" ORDER BY j.id DESC LIMIT ")
        sql.bind(max(1, min(limit, 10_000)))
        var result: [EffectJobSummary] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(
            (Int, String, Int, String, String, String?, String?, Date, Date, Date?, String?, String?).self)
        {
            guard let state = JobState(rawValue: row.1) else { continue }
            result.append(
                EffectJobSummary(
                    id: row.0, state: state, attempt: row.2, jti: row.3, aud: row.4, sub: row.5, type: row.6, runAt: row.7, createdAt: row.8,
                    finishedAt: row.9, lockedBy: row.10, lastError: row.11))
        }
        return result
    }
}
