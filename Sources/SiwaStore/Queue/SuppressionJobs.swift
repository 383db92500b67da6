import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// How one provider's lane stands: what waits, what failed for good, when it last succeeded.
package struct SuppressionTargetStatus: Sendable, Equatable {
    package var target: SuppressionTarget
    /// Open: waiting, retrying or in flight.
    package var pending: Int
    /// Of those, failed at least once and waiting to be tried again.
    package var retrying: Int
    /// Dead letters: out of attempts, kept until an operator retries them.
    package var discarded: Int
    package var lastSuccess: Date?
    /// The newest failure's words (the provider's own), if the lane is failing now.
    package var lastError: String?
}

/// The suppression lanes' own statements beside the generic ones (`list`, `depth`): each
/// provider's status, a retry that re-sends an address's current state (so a dead letter put back
/// never sends a stale action), and the backfill of `suppressions sync`.
extension JobQueue {
    /// Every provider's lane, in `SuppressionTarget` order, through the lanes' partial indexes.
    package func suppressionTargets() async throws -> [SuppressionTargetStatus] {
        var result: [SuppressionTargetStatus] = []
        for target in SuppressionTarget.allCases {
            let lane = Lane.suppressions(target).rawValue
            for try await row in try await client.bounded.query(
                """
                SELECT (SELECT count(*) FROM jobs WHERE lane = \(lane) AND target IS NOT NULL AND state IN ('available', 'retryable', 'running'))::bigint,
                    (SELECT count(*) FROM jobs WHERE lane = \(lane) AND state = 'retryable')::bigint,
                    (SELECT count(*) FROM jobs WHERE lane = \(lane) AND state = 'discarded')::bigint,
                    (SELECT max(finished_at) FROM jobs WHERE lane = \(lane) AND state = 'completed'),
                    (SELECT last_error FROM jobs WHERE lane = \(lane) AND state = 'retryable' ORDER BY run_at DESC LIMIT 1)
                """, logger: logger
            ).decode((Int, Int, Int, Date?, String?).self) {
                result.append(
                    SuppressionTargetStatus(target: target, pending: row.0, retrying: row.1, discarded: row.2, lastSuccess: row.3, lastError: row.4))
            }
        }
        return result
    }

    /// Puts a suppression lane's jobs back (one by id, or every dead letter), each carrying its
    /// address's current state: suppressed now, it suppresses; lifted, it lifts.
    package func retrySuppressions(_ target: SuppressionTarget, id: Int?, discarded: Bool) async throws -> Int {
        let lane = Lane.suppressions(target)
        let count = try await client.bounded.count(
            """
            WITH retried AS (
                UPDATE jobs j SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL, last_status = NULL,
                    locked_by = NULL, lease_expires_at = NULL, failing_since = NULL,
                    kind = CASE WHEN s.suppressed THEN 'suppress' ELSE 'lift' END, payload = s.reason
                FROM suppressions s
                WHERE j.lane = \(lane.rawValue) AND j.state IN ('available', 'retryable', 'discarded') AND s.aud = j.aud AND s.address = j.target
                  AND ((\(id)::bigint IS NOT NULL AND j.id = \(id)) OR (\(discarded) AND j.state = 'discarded'))
                RETURNING j.id
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger)
        if count > 0 { try await notify(lane) }
        return count
    }

    /// Where a backfill of `target` stands.
    package struct SuppressionSync: Sendable, Equatable {
        package var queued: Int
        package var finished: Date?
        /// This call's chunk.
        package var added: Int
    }

    /// One chunk of a backfill: the next `limit` addresses of `apps` after the sync's cursor, each
    /// queued with its current state, and the cursor moved, in one transaction, so a killed run
    /// resumes where its last chunk committed and queues no address twice. `restart`: from the start.
    package func syncSuppressions(_ target: SuppressionTarget, apps: [String], limit: Int, restart: Bool = false) async throws -> SuppressionSync {
        let lane = Lane.suppressions(target)
        let logger = self.logger
        let result = try await client.bounded.transaction(logger: logger) { connection -> SuppressionSync in
            for try await _ in try await connection.query(
                """
                INSERT INTO suppression_syncs (target) VALUES (\(target.rawValue))
                ON CONFLICT (target) DO UPDATE SET after_aud = '', after_address = '', queued = 0, started_at = now(), finished_at = NULL
                    WHERE \(restart)
                """, logger: logger) {}
            var sync = SuppressionSync(queued: 0, finished: nil, added: 0)
            for try await row in try await connection.query(
                """
                WITH cursor AS (
                    SELECT after_aud, after_address, queued, finished_at FROM suppression_syncs WHERE target = \(target.rawValue) FOR UPDATE
                ), chunk AS (
                    SELECT s.aud, s.address, s.sub, s.suppressed, s.reason FROM suppressions s, cursor c
                    WHERE c.finished_at IS NULL AND s.aud = ANY(\(apps)::text[]) AND (s.aud, s.address) > (c.after_aud, c.after_address)
                    ORDER BY s.aud, s.address LIMIT \(max(1, limit))
                ), queued AS (
                    INSERT INTO jobs (lane, kind, aud, sub, target, payload, run_at)
                    SELECT \(lane.rawValue), CASE WHEN suppressed THEN 'suppress' ELSE 'lift' END, aud, sub, address, reason, now()
                    FROM chunk ORDER BY aud, address
                    RETURNING 1
                ), last AS (
                    SELECT aud, address FROM chunk ORDER BY aud DESC, address DESC LIMIT 1
                ), moved AS (
                    UPDATE suppression_syncs t SET
                        after_aud = coalesce((SELECT aud FROM last), t.after_aud), after_address = coalesce((SELECT address FROM last), t.after_address),
                        queued = t.queued + (SELECT count(*) FROM chunk),
                        finished_at = CASE WHEN t.finished_at IS NOT NULL THEN t.finished_at WHEN (SELECT count(*) FROM chunk) < \(max(1, limit)) THEN now() END
                    WHERE t.target = \(target.rawValue)
                    RETURNING t.queued, t.finished_at
                )
                SELECT (SELECT queued FROM moved), (SELECT finished_at FROM moved), (SELECT count(*) FROM queued)::bigint
                """, logger: logger
            ).decode((Int, Date?, Int).self) {
                sync = SuppressionSync(queued: row.0, finished: row.1, added: row.2)
            }
            return sync
        }
        if result.added > 0 { try await notify(lane) }
        return result
    }

    /// Jobs of `target`'s lane still open (what a paced backfill waits on).
    package func openSuppressions(_ target: SuppressionTarget) async throws -> Int {
        try await client.bounded.count(
            "SELECT count(*)::bigint FROM jobs WHERE lane = \(Lane.suppressions(target).rawValue) AND target IS NOT NULL AND state IN ('available', 'retryable', 'running')",
            logger: logger)
    }
}

extension JobQueue {
    /// `suppression_target_failing`'s reads: per provider with a failing or dead operation, how
    /// long its oldest failing one has waited at `now`, and its dead letters since `since`. One
    /// statement over the lanes' ready and discarded indexes.
    package func suppressionsFailing(since: Date, now: Date) async throws -> [SuppressionTarget: SuppressionTargetRule.Observed] {
        let lanes = SuppressionTarget.allCases.map { Lane.suppressions($0).rawValue }
        var result: [SuppressionTarget: SuppressionTargetRule.Observed] = [:]
        for try await (lane, seconds, discarded) in try await client.bounded.query(
            """
            SELECT l.lane,
                (SELECT extract(epoch FROM \(now)::timestamptz - min(failing_since))::bigint FROM jobs
                 WHERE lane = l.lane AND target IS NOT NULL AND state IN ('available', 'retryable', 'running') AND failing_since IS NOT NULL),
                (SELECT count(*) FROM jobs WHERE lane = l.lane AND state = 'discarded' AND finished_at >= \(since))::bigint
            FROM unnest(\(lanes)::text[]) AS l(lane)
            """, logger: logger
        ).decode((String, Int?, Int).self) {
            guard let target = SuppressionTarget.allCases.first(where: { Lane.suppressions($0).rawValue == lane }) else { continue }
            guard seconds != nil || discarded > 0 else { continue }
            result[target] = SuppressionTargetRule.Observed(failingFor: seconds.map { .seconds($0) }, discarded: discarded)
        }
        return result
    }
}

/// One provider's operation for a user's address, as the user's timeline shows it.
package struct SuppressionOperation: Sendable, Equatable {
    package var target: SuppressionTarget
    package var address: String
    package var action: SuppressionAction
    package var state: JobState
    package var attempt: Int
    package var createdAt: Date
    package var finishedAt: Date?
    package var lastError: String?
}

extension JobQueue {
    /// The body of a data-modifying CTE that queues one job per row of `changes` (columns `aud`,
    /// `sub`, `address`, `action`, `reason`, `n`: the change's order) and lane of `lanes` (`lane`,
    /// `m`), in change order, returning `lane`.
    static func enqueueSuppressionsSQL(changes: String, lanes: String) -> String {
        """
        INSERT INTO jobs (lane, kind, aud, sub, target, payload, run_at)
        SELECT l.lane, c.action, c.aud, c.sub, c.address, c.reason, now()
        FROM \(changes) c CROSS JOIN \(lanes) l
        ORDER BY c.n, l.m
        RETURNING lane
        """
    }

    /// Each provider's operations for the user's addresses, oldest first (the user's timeline).
    package func suppressionOperations(aud: String, sub: String, limit: Int) async throws -> [SuppressionOperation] {
        let lanes = SuppressionTarget.allCases.map { Lane.suppressions($0).rawValue }
        var operations: [SuppressionOperation] = []
        for try await row in try await client.bounded.query(
            """
            SELECT lane, target, kind, state::text, attempt, created_at, finished_at, last_error FROM jobs
            WHERE lane = ANY(\(lanes)::text[]) AND aud = \(aud) AND sub = \(sub) AND target IS NOT NULL
            ORDER BY id LIMIT \(max(1, min(limit, 10_000)))
            """, logger: logger
        ).decode((String, String, String, String, Int, Date, Date?, String?).self) {
            guard let target = SuppressionTarget.allCases.first(where: { Lane.suppressions($0).rawValue == row.0 }),
                let action = SuppressionAction(rawValue: row.2), let state = JobState(rawValue: row.3)
            else { continue }
            operations.append(
                SuppressionOperation(
                    target: target, address: row.1, action: action, state: state, attempt: row.4, createdAt: row.5, finishedAt: row.6, lastError: row.7))
        }
        return operations
    }
}
