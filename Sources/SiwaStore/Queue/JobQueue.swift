import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import SiwaRuntime

/// The job queue: the one owner of the `jobs` and `job_attempts` tables. Each lane's statements
/// live beside this file (`EffectLane.swift`, `DeliveryLanes.swift`); this file holds what every
/// lane shares — lease rescue, heartbeat, release, pruning — and the depth reads of monitoring.
/// `history` reads the attempt log through `AttemptLog.swift`.
///
/// Rules that compare with the clock take `now` (nil: PostgreSQL's `now()`), so tests can drive
/// them without waiting.
package struct JobQueue: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: JobsRescue, JobsHeartbeat, JobsRelease, JobsPrune

    /// Jobs whose lease ran out (their deliverer was killed, not stopped) go back to the queue, or
    /// are discarded once out of attempts; in every lane (an older release may have left effect
    /// jobs `running`; only an effect job's notification changes status). Safe to run from every
    /// process at once.
    @discardableResult
    package func rescueExpiredLeases(maxAttempts: Int, now: Date? = nil) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH clock AS (SELECT coalesce(\(now)::timestamptz, now()) AS now
            ), expired AS (
                SELECT id, locked_by FROM jobs WHERE state = 'running' AND lease_expires_at < (SELECT now FROM clock)
                FOR UPDATE SKIP LOCKED
            ), rescued AS (
                UPDATE jobs j SET
                    state = CASE WHEN j.attempt >= \(maxAttempts) THEN 'discarded'::job_state ELSE 'retryable'::job_state END,
                    finished_at = CASE WHEN j.attempt >= \(maxAttempts) THEN (SELECT now FROM clock) END,
                    run_at = (SELECT now FROM clock), locked_by = NULL, lease_expires_at = NULL,
                    last_error = 'lease expired: worker ' || e.locked_by || ' stopped renewing it'
                FROM expired e WHERE j.id = e.id
                RETURNING j.id, j.notification_id, j.alert_id, j.attempt, j.attempted_at, j.state, j.lane, e.locked_by
            ), logged AS (
                INSERT INTO job_attempts (job_id, notification_id, alert_id, attempt, worker, started_at, outcome, error, lane)
                SELECT id, notification_id, alert_id, attempt, locked_by, attempted_at, \(AttemptOutcome.leaseExpired.rawValue), 'lease expired', lane
                FROM rescued
            )
            SELECT count(*)::bigint FROM rescued
            """, logger: logger)
    }

    /// Renews the leases of `jobs`, those of them `worker` still holds, to `lease` after `now`.
    package func heartbeat(worker: String, jobs: [Int], lease: Duration, now: Date? = nil) async throws {
        let leaseMillis = Int(lease.milliseconds)
        try await client.bounded.query(
            """
            UPDATE jobs SET lease_expires_at = coalesce(\(now)::timestamptz, now()) + \(leaseMillis) * interval '1 millisecond'
            WHERE id = ANY(\(jobs)::bigint[]) AND state = 'running' AND locked_by = \(worker)
            """, logger: logger)
    }

    /// Graceful shutdown: leased jobs `workers` still hold (deliveries) go back to the queue as if
    /// never attempted, in one statement (shutdown waits on it once, not once per deliverer).
    /// Returns how many each held.
    @discardableResult
    package func release(workers: [String]) async throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for try await (worker, n) in try await client.bounded.query(
            """
            WITH held AS (
                SELECT id, locked_by FROM jobs WHERE state = 'running' AND locked_by = ANY(\(workers)::text[]) FOR UPDATE
            ), released AS (
                UPDATE jobs j SET state = 'available', run_at = now(), attempt = j.attempt - 1, locked_by = NULL, lease_expires_at = NULL
                FROM held WHERE j.id = held.id
                RETURNING held.locked_by
            ) SELECT locked_by, count(*)::bigint FROM released GROUP BY locked_by
            """, logger: logger
        ).decode((String, Int).self) {
            counts[worker] = n
        }
        return counts
    }

    /// Deletes up to `limit` jobs finished more than `retention` before `now` (their attempts stay
    /// in job_attempts). A discarded job is pruned only in a lane known to hold no secret: one of
    /// a secret lane still holds its payload (a discarded Apple revocation: the token's only copy)
    /// and waits for `jobs retry --lane … --discarded`, however old.
    @discardableResult
    package func prune(retention: Duration, limit: Int = 10_000, now: Date? = nil) async throws -> Int {
        var count = 0
        let prunable = Lane.all.filter { !$0.payloadIsSecret }.map(\.rawValue)
        for try await (n,) in try await client.bounded.query(
            """
            WITH pruned AS (
                DELETE FROM jobs WHERE id IN (
                    SELECT id FROM jobs WHERE state IN ('completed', 'discarded')
                      AND finished_at < coalesce(\(now)::timestamptz, now()) - \(Int(retention.components.seconds)) * interval '1 second'
                      AND (state = 'completed' OR lane = ANY(\(prunable)::text[]))
                    LIMIT \(limit))
                RETURNING id
            ) SELECT count(*)::bigint FROM pruned
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }

    // MARK: JobsDepth, JobsSignals

    /// How many jobs of a lane are in a state.
    package struct Depth: Sendable, Equatable {
        package var lane: Lane
        package var state: JobState
        package var count: Int
    }

    /// Jobs not completed, per lane and state. Each branch matches one partial index (each lane's
    /// ready jobs, `Lane.readyIndex`; running; discarded), so completed jobs — most of the table —
    /// are never read.
    package func depth() async throws -> [Depth] {
        let ready = Lane.all.flatMap(Self.readyConditions).map { "SELECT lane, state::text, count(*)::bigint FROM jobs WHERE \($0) GROUP BY 1, 2" }
        let sql = (ready + [
            "SELECT lane, 'running', count(*)::bigint FROM jobs WHERE state = 'running' GROUP BY 1",
            "SELECT lane, 'discarded', count(*)::bigint FROM jobs WHERE state = 'discarded' GROUP BY 1",
        ]).joined(separator: "\nUNION ALL\n")
        var result: [Depth] = []
        for try await row in try await client.bounded.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode((String, String, Int).self) {
            guard let lane = Lane(rawValue: row.0), let state = JobState(rawValue: row.1) else { continue }
            result.append(Depth(lane: lane, state: state, count: row.2))
        }
        return result
    }

    /// Seconds the oldest ready job (any lane) has waited at `now` (`queue_lag`).
    ///
    /// The oldest ready job is looked for through each lane's ready-jobs indexes in turn, so that
    /// it reads the ready jobs, not the table: one condition over all lanes matched no partial
    /// index and scanned every job kept. Available effect jobs are indexed in event order
    /// (sql/010), so their oldest is a walk of that index.
    package func queueLag(now: Date? = nil) async throws -> Int {
        let oldest = Lane.all.flatMap(Self.readyConditions).map { "(SELECT min(run_at) FROM jobs WHERE \($0) AND run_at <= clock.now)" }
        var lag = 0
        for try await (seconds,) in try await client.bounded.query(
            """
            WITH clock AS (SELECT coalesce(\(now)::timestamptz, now()) AS now)
            SELECT coalesce(extract(epoch FROM clock.now - least(\(unescaped: oldest.joined(separator: ", "))))::bigint, 0) FROM clock
            """, logger: logger
        ).decode((Int,).self) {
            lag = seconds
        }
        return lag
    }

    /// When each of `lanes` next has a job to claim (nil: none waiting), and the database's now:
    /// the listener's check for what a lost NOTIFY left behind and for retries falling due. One
    /// statement; each branch reads the head of one partial index, so an idle check costs a few
    /// index probes whatever the queue holds (available effect jobs are indexed in event order,
    /// so for them only whether one is ready now is asked).
    /// `connection`: run there (the listener's own, so a check opens no connection).
    package func nextDue(_ lanes: [Lane], on connection: PostgresConnection? = nil) async throws -> (now: Date, due: [Lane: Date]) {
        var branches: [String] = []
        for lane in lanes {
            for condition in Self.readyConditions(lane) {
                let head =
                    lane.readyIndex == .onePerState && condition.hasSuffix("'\(JobState.available.rawValue)'")
                    ? "(SELECT now() FROM jobs WHERE \(condition) AND run_at <= now() LIMIT 1)"
                    : "(SELECT min(run_at) FROM jobs WHERE \(condition))"
                branches.append("SELECT '\(lane)'::text, \(head)")
            }
        }
        var result: (now: Date, due: [Lane: Date]) = (Date(), [:])
        guard !branches.isEmpty else { return result }
        let query = PostgresQuery(unsafeSQL: "SELECT NULL::text, now() UNION ALL " + branches.joined(separator: " UNION ALL "))
        let logger = self.logger
        let rows =
            if let connection {
                try await withDeadline(BoundedPostgres.defaultLimit) { try await connection.query(query, logger: logger) }
            } else {
                try await client.bounded.query(query, logger: logger)
            }
        for try await (name, at) in rows.decode((String?, Date?).self) {
            guard let at else { continue }
            guard let name else {
                result.now = at
                continue
            }
            guard let lane = lanes.first(where: { $0.rawValue == name }) else { continue }
            result.due[lane] = min(result.due[lane] ?? at, at)
        }
        return result
    }

    /// Jobs discarded since `since`, by lane (`jobs_discarded`), through the index of discarded jobs.
    package func discardedByLane(since: Date) async throws -> [String: Int] {
        var discarded: [String: Int] = [:]
        for try await (lane, n) in try await client.bounded.query(
            "SELECT lane, count(*)::bigint FROM jobs WHERE state = 'discarded' AND finished_at >= \(since) GROUP BY lane", logger: logger
        ).decode((String, Int).self) {
            discarded[lane] = n
        }
        return discarded
    }

    /// The conditions that select `lane`'s ready jobs, one per partial index of them.
    package static func readyConditions(_ lane: Lane) -> [String] {
        switch lane.readyIndex {
        case .oneForBoth:
            ["lane = '\(lane)' AND state IN ('\(JobState.available.rawValue)', '\(JobState.retryable.rawValue)')"]
        case .onePerState:
            [JobState.available, .retryable].map { "lane = '\(lane)' AND state = '\($0.rawValue)'" }
        }
    }
}
