import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A delivery job held by a deliverer: what to send, where, and under which message id.
package struct ClaimedDelivery: Sendable {
    package var id: Int
    package var attempt: Int
    package var lane: Lane
    /// Callbacks: the notification; alerts: nil.
    package var notificationID: Int?
    package var jti: String
    /// Alerts: the alert and the message kind.
    package var alertID: Int?
    /// Alerts: the sink (`slack`, `webhook:<hash>`); Apple revocations: the client ID.
    package var target: String?
    /// Apple revocations: the user.
    package var aud: String?
    package var sub: String?
    package var kind: String
    package var body: String
    package var claimedAt: Date
}

/// One delivery attempt's result.
package enum DeliveryOutcome: Sendable {
    /// Done: the endpoint answered 2xx (`status`), or nothing was left to send (nil).
    case delivered(status: Int?)
    /// Anything else: a non-2xx status, or no answer (`status` nil) with the reason.
    case failed(status: Int?, error: String)
    /// Cannot be sent, now or later (e.g. its destination is no longer configured): discarded at once.
    case undeliverable(error: String)
    /// Failed, and the other side said when to come back (a 429's `Retry-After`): retried no sooner.
    case throttled(status: Int?, error: String, retryAfter: Duration)
}

/// One sink message of an alert and how its delivery went.
package struct AlertDelivery: Sendable {
    package var target: String
    package var state: JobState
    package var lastStatus: Int?
    package var lastError: String?
}

/// The delivery lanes (callbacks to the backend, alerts to sinks): leased claims, attempt
/// records, the alert enqueue, and the operator's views.
extension JobQueue {
    /// The Standard Webhooks `webhook-id` of notification `notificationID`'s callback: the same on
    /// every retry and redelivery, so the receiver can use it as an idempotency key.
    package static func webhookID(notificationID: Int) -> String { "msg_\(notificationID)" }

    /// The notification a callback's `webhook-id` (`msg_<n>`) names; nil for anything else.
    package static func notificationID(webhookID: String) -> Int? {
        guard webhookID.hasPrefix("msg_"), let id = Int(webhookID.dropFirst(4)), id > 0, "msg_\(id)" == webhookID else { return nil }
        return id
    }

    // MARK: DeliveriesClaim

    /// Claims up to `limit` ready deliveries of `lane` (ready at `now`), oldest first, leased for
    /// `lease`. No per-user gate: a callback carries its event_time, and a receiver orders by it
    /// if it needs to.
    package func claimDeliveries(lane: Lane, worker: String, limit: Int, lease: Duration, now: Date? = nil) async throws -> [ClaimedDelivery] {
        let rows = try await client.bounded.query(
            """
            WITH candidates AS (
                SELECT id FROM jobs
                WHERE lane = \(lane.rawValue) AND state IN ('available', 'retryable') AND run_at <= coalesce(\(now)::timestamptz, now())
                  AND (NOT \(lane.inOrderPerTarget) OR NOT EXISTS (
                      SELECT 1 FROM jobs e WHERE e.lane = jobs.lane AND e.aud = jobs.aud AND e.target = jobs.target
                        AND e.state IN ('available', 'retryable', 'running') AND e.id < jobs.id))
                ORDER BY run_at, id
                LIMIT \(limit)
                FOR UPDATE SKIP LOCKED
            )
            UPDATE jobs SET state = 'running', attempt = jobs.attempt + 1, attempted_at = coalesce(\(now)::timestamptz, now()), locked_by = \(worker),
                lease_expires_at = coalesce(\(now)::timestamptz, now()) + \(Int(lease.milliseconds)) * interval '1 millisecond'
            FROM candidates
            WHERE jobs.id = candidates.id
            RETURNING jobs.id, jobs.attempt, jobs.notification_id, (SELECT n.jti FROM notifications n WHERE n.id = jobs.notification_id),
                jobs.alert_id, jobs.target, jobs.kind, jobs.payload, jobs.attempted_at, jobs.aud, jobs.sub
            """, logger: logger)
        var claimed: [ClaimedDelivery] = []
        for try await row in rows.decode((Int, Int, Int?, String?, Int?, String?, String, String, Date, String?, String?).self) {
            claimed.append(
                ClaimedDelivery(
                    id: row.0, attempt: row.1, lane: lane, notificationID: row.2, jti: row.3 ?? "", alertID: row.4, target: row.5, aud: row.9,
                    sub: row.10, kind: row.6, body: row.7, claimedAt: row.8))
        }
        return claimed
    }

    // MARK: DeliveriesRecord

    /// Records one attempt: completed when delivered (a secret payload is then cleared); otherwise
    /// retryable after `delay`, or discarded once `maxAttempts` is reached. Only if the job is
    /// still held by `worker`.
    /// Returns the state the job is in now (nil: no longer held — its lease ran out).
    @discardableResult
    package func recordDelivery(
        _ callback: ClaimedDelivery, worker: String, outcome: DeliveryOutcome, maxAttempts: Int, delay: Duration
    ) async throws -> JobState? {
        let status: Int?
        let error: String?
        var maxAttempts = maxAttempts
        switch outcome {
        case .delivered(let code): (status, error) = (code, nil)
        case .failed(let code, let message), .throttled(let code, let message, _): (status, error) = (code, message)
        case .undeliverable(let message): (status, error, maxAttempts) = (nil, message, 1)
        }
        let delivered = error == nil
        var state: JobState?
        for try await (s,) in try await client.bounded.query(
            """
            WITH recorded AS (
                UPDATE jobs SET
                    state = CASE WHEN \(delivered) THEN 'completed'::job_state
                                 WHEN attempt >= \(maxAttempts) THEN 'discarded'::job_state
                                 ELSE 'retryable'::job_state END,
                    finished_at = CASE WHEN \(delivered) OR attempt >= \(maxAttempts) THEN now() END,
                    run_at = CASE WHEN \(delivered) THEN run_at ELSE now() + \(Int(delay.milliseconds)) * interval '1 millisecond' END,
                    last_status = \(status), last_error = \(error), locked_by = NULL, lease_expires_at = NULL,
                    failing_since = CASE WHEN \(delivered) THEN NULL ELSE coalesce(failing_since, now()) END,
                    payload = CASE WHEN \(delivered) AND \(callback.lane.payloadIsSecret) THEN NULL ELSE payload END
                WHERE id = \(callback.id) AND attempt = \(callback.attempt) AND state = 'running' AND locked_by = \(worker)
                RETURNING id, notification_id, alert_id, attempt, attempted_at, state
            ), logged AS (
                INSERT INTO job_attempts (job_id, notification_id, alert_id, attempt, worker, started_at, outcome, error, lane, http_status)
                SELECT id, notification_id, alert_id, attempt, \(worker), attempted_at,
                    CASE state WHEN 'completed' THEN 'delivered' WHEN 'discarded' THEN 'discarded' ELSE 'retrying' END,
                    \(error), \(callback.lane.rawValue), \(status)
                FROM recorded
            )
            SELECT state::text FROM recorded
            """, logger: logger
        ).decode((String,).self) {
            state = JobState(rawValue: s)
        }
        return state
    }

    // MARK: CallbacksRedeliver, CallbacksList

    /// Sends callbacks again (same `webhook-id`, fresh attempts): one by job id or by its
    /// notification (the `msg_<n>` a backend saw), or every one created since `since`. A callback
    /// being delivered right now is left alone. Returns how many.
    @discardableResult
    package func redeliverCallbacks(id: Int?, notificationID: Int? = nil, since: Date?) async throws -> Int {
        let count = try await client.bounded.count(
            """
            WITH redelivered AS (
                UPDATE jobs SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL,
                    last_status = NULL, locked_by = NULL, lease_expires_at = NULL
                WHERE lane = \(Lane.callbacks.rawValue) AND state <> 'running'
                  AND ((\(id)::bigint IS NOT NULL AND id = \(id)) OR (\(since)::timestamptz IS NOT NULL AND created_at >= \(since))
                       OR (\(notificationID)::bigint IS NOT NULL AND notification_id = \(notificationID)))
                RETURNING id
            )
            SELECT count(*)::bigint FROM redelivered
            """, logger: logger)
        if count > 0 { try await notify(.callbacks) }
        return count
    }

    /// A callback delivery as `callbacks list` shows it.
    package struct CallbackSummary: Sendable {
        package var id: Int
        package var webhookID: String
        package var state: JobState
        package var attempt: Int
        package var jti: String
        package var aud: String?
        package var type: String?
        package var createdAt: Date
        package var runAt: Date
        package var finishedAt: Date?
        package var lastStatus: Int?
        package var lastError: String?
    }

    /// Newest first. `failed`: only callbacks not delivered (yet) after at least one attempt —
    /// retrying or discarded.
    package func listCallbacks(failed: Bool, limit: Int) async throws -> [CallbackSummary] {
        var sql = SQLBuilder(
            """
            SELECT j.id, j.notification_id, j.state::text, j.attempt, n.jti, j.aud, n.type, j.created_at, j.run_at, j.finished_at,
                j.last_status, j.last_error
            FROM jobs j JOIN notifications n ON n.id = j.notification_id
            """)
        sql.filter("j.lane =", Lane.callbacks.rawValue)
        if failed { sql.append(" AND j.state IN ('retryable', 'discarded')") }
        sql.append(" ORDER BY j.created_at DESC, j.id DESC LIMIT ")
        sql.bind(max(1, min(limit, 10_000)))
        var result: [CallbackSummary] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(
            (Int, Int, String, Int, String, String?, String?, Date, Date, Date?, Int?, String?).self)
        {
            guard let state = JobState(rawValue: row.2) else { continue }
            result.append(
                CallbackSummary(
                    id: row.0, webhookID: Self.webhookID(notificationID: row.1), state: state, attempt: row.3, jti: row.4, aud: row.5, type: row.6,
                    createdAt: row.7, runAt: row.8, finishedAt: row.9, lastStatus: row.10, lastError: row.11))
        }
        return result
    }

    // MARK: AlertsEnqueue, AlertDeliveriesList

    /// Enqueues one delivery per sink message of alert `alertID`, in the caller's transaction, and
    /// tells deliverers at its commit.
    static func enqueueAlerts(_ messages: [SinkMessage], alertID: Int, on connection: PostgresConnection, logger: Logger) async throws {
        guard !messages.isEmpty else { return }
        // Rows read to the end: unread, a failed insert's error would surface nowhere and the
        // transaction's COMMIT would quietly roll back.
        for try await _ in try await connection.query(
            """
            WITH queued AS (
                INSERT INTO jobs (lane, kind, alert_id, target, payload, run_at)
                SELECT \(Lane.alerts.rawValue), m.kind, \(alertID), m.target, m.body, now()
                FROM unnest(\(messages.map(\.target))::text[], \(messages.map(\.kind))::text[], \(messages.map(\.body))::text[]) AS m(target, kind, body)
                ON CONFLICT DO NOTHING
                RETURNING id
            )
            SELECT pg_notify('siwa_jobs', \(Lane.alerts.rawValue)) FROM (SELECT 1 FROM queued LIMIT 1) q
            """, logger: logger) {}
    }

    /// The deliveries of alert `alertID`, one per sink, in enqueue order.
    package func alertDeliveries(alertID: Int) async throws -> [AlertDelivery] {
        var result: [AlertDelivery] = []
        for try await row in try await client.bounded.query(
            "SELECT target, state::text, last_status, last_error FROM jobs WHERE lane = \(Lane.alerts.rawValue) AND alert_id = \(alertID) ORDER BY id",
            logger: logger
        ).decode((String, String, Int?, String?).self) {
            guard let state = JobState(rawValue: row.1) else { continue }
            result.append(AlertDelivery(target: row.0, state: state, lastStatus: row.2, lastError: row.3))
        }
        return result
    }
}
