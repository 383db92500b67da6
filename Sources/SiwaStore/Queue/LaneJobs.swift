import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A job to enqueue in any lane: its subject (as its lane declares), what it is, and its payload.
package struct NewJob: Sendable {
    package enum Subject: Sendable {
        case notification(id: Int)
        case alert(id: Int, target: String)
        case user(aud: String, sub: String, target: String)
    }

    package var lane: Lane
    package var subject: Subject
    /// What the job does within its lane (unique per notification and lane for a notification's).
    package var kind: String
    package var payload: String?
    package var runAt: Date?

    package init(lane: Lane, subject: Subject, kind: String, payload: String?, runAt: Date? = nil) {
        self.lane = lane
        self.subject = subject
        self.kind = kind
        self.payload = payload
        self.runAt = runAt
    }
}

/// A job of any lane as `jobs list --lane` shows it (never its payload).
package struct JobSummary: Sendable, Equatable {
    package var id: Int
    package var lane: String
    package var state: JobState
    package var attempt: Int
    package var kind: String
    package var notificationID: Int?
    package var alertID: Int?
    package var aud: String?
    package var sub: String?
    package var target: String?
    package var createdAt: Date
    package var runAt: Date
    package var finishedAt: Date?
    package var lastStatus: Int?
    package var lastError: String?

    package var json: JSONValue {
        .object([
            "id": .number(Double(id)), "lane": .string(lane), "state": .string(state.rawValue), "attempt": .number(Double(attempt)),
            "kind": .string(kind), "notification_id": notificationID.map { .number(Double($0)) } ?? .null,
            "alert_id": alertID.map { .number(Double($0)) } ?? .null, "aud": aud.map(JSONValue.string) ?? .null,
            "sub": sub.map(JSONValue.string) ?? .null, "target": target.map(JSONValue.string) ?? .null,
            "created_at": .string(iso8601(createdAt)), "run_at": .string(iso8601(runAt)),
            "finished_at": finishedAt.map { .string(iso8601($0)) } ?? .null,
            "last_status": lastStatus.map { .number(Double($0)) } ?? .null, "last_error": lastError.map(JSONValue.string) ?? .null,
        ])
    }
}

/// What every lane shares for an operator and a producer: enqueue, list, retry. A lane's own
/// statements (the effects' batch claim, a delivery's lease) live beside this file.
extension JobQueue {
    // MARK: JobsEnqueue

    /// A subquery that tells `lane`'s workers (NOTIFY `siwa_jobs`, at commit) when `relation`, the
    /// jobs a producer's statement queued, has a row; its value is how many it sent (0 or 1).
    static func notifySQL(_ lane: Lane, ifAnyIn relation: String) -> String {
        "(SELECT count(pg_notify('siwa_jobs', '\(lane.rawValue)')) FROM (SELECT 1 FROM \(relation) LIMIT 1) queued_any)"
    }

    /// Enqueues `jobs` (each of the subject its lane declares) and tells their lanes' workers.
    /// Returns the new jobs' ids; a notification's job already in that lane adds none.
    @discardableResult
    package func enqueue(_ jobs: [NewJob]) async throws -> [Int] {
        guard !jobs.isEmpty else { return [] }
        for job in jobs {
            let matches: Bool =
                switch (job.lane.subject, job.subject) {
                case (.notification, .notification), (.alert, .alert), (.user, .user): true
                default: false
                }
            precondition(matches, "lane \(job.lane) takes jobs about a \(job.lane.subject.rawValue)")
        }
        func column<T>(_ value: (NewJob.Subject) -> T?) -> [T?] { jobs.map { value($0.subject) } }
        let notifications = column { if case .notification(let id) = $0 { Int64(id) } else { nil } }
        let alerts = column { if case .alert(let id, _) = $0 { Int64(id) } else { nil } }
        let auds = column { if case .user(let aud, _, _) = $0 { aud } else { nil } }
        let subs = column { if case .user(_, let sub, _) = $0 { sub } else { nil } }
        let targets = column { subject -> String? in
            switch subject {
            case .notification: nil
            case .alert(_, let target), .user(_, _, let target): target
            }
        }
        var ids: [Int] = []
        for try await (id, _) in try await client.bounded.query(
            """
            WITH new AS (
                SELECT * FROM unnest(\(jobs.map(\.lane.rawValue))::text[], \(NullableArray(notifications))::int8[], \(NullableArray(alerts))::int8[],
                    \(NullableArray(auds))::text[], \(NullableArray(subs))::text[], \(NullableArray(targets))::text[], \(jobs.map(\.kind))::text[],
                    \(NullableArray(jobs.map(\.payload)))::text[], \(NullableArray(jobs.map(\.runAt)))::timestamptz[])
                    AS j(lane, notification_id, alert_id, aud, sub, target, kind, payload, run_at)
            ), queued AS (
                INSERT INTO jobs (lane, notification_id, alert_id, aud, sub, event_time, target, kind, payload, run_at)
                SELECT j.lane, j.notification_id, j.alert_id, coalesce(j.aud, n.aud), coalesce(j.sub, n.sub), n.event_time, j.target, j.kind, j.payload,
                    coalesce(j.run_at, now())
                FROM new j LEFT JOIN notifications n ON n.id = j.notification_id
                ON CONFLICT DO NOTHING
                RETURNING id, lane
            ), told AS (
                SELECT pg_notify('siwa_jobs', lane) FROM (SELECT DISTINCT lane FROM queued) l
            )
            SELECT q.id, (SELECT count(*) FROM told)::bigint FROM queued q
            """, logger: logger
        ).decode((Int, Int).self) {
            ids.append(id)
        }
        return ids
    }

    // MARK: JobsList

    /// A lane's jobs, newest first; optionally only those in `state`.
    package func list(lane: Lane, state: JobState? = nil, limit: Int) async throws -> [JobSummary] {
        var result: [JobSummary] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, lane, state::text, attempt, kind, notification_id, alert_id, aud, sub, target, created_at, run_at, finished_at, last_status, last_error
            FROM jobs WHERE lane = \(lane.rawValue) AND (\(state?.rawValue)::text IS NULL OR state::text = \(state?.rawValue))
            ORDER BY created_at DESC, id DESC LIMIT \(max(1, min(limit, 10_000)))
            """, logger: logger
        ).decode((Int, String, String, Int, String, Int?, Int?, String?, String?, String?, Date, Date, Date?, Int?, String?).self) {
            guard let state = JobState(rawValue: row.2) else { continue }
            result.append(
                JobSummary(
                    id: row.0, lane: row.1, state: state, attempt: row.3, kind: row.4, notificationID: row.5, alertID: row.6, aud: row.7, sub: row.8,
                    target: row.9, createdAt: row.10, runAt: row.11, finishedAt: row.12, lastStatus: row.13, lastError: row.14))
        }
        return result
    }

    // MARK: JobsRetry

    /// Puts a lane's jobs back in the queue with fresh attempts: one by id, or every discarded
    /// one. A job being worked on, or completed, is left alone (to send a delivered callback again,
    /// `redeliverCallbacks`). An effect job's notification shows `pending` again.
    @discardableResult
    package func retry(lane: Lane, id: Int?, discarded: Bool) async throws -> Int {
        if lane == .effects { return try await retryEffects(jobID: id, discarded: discarded, type: nil) }
        if let target = SuppressionTarget.allCases.first(where: { Lane.suppressions($0) == lane }) {
            return try await retrySuppressions(target, id: id, discarded: discarded)
        }
        let count = try await client.bounded.count(
            """
            WITH retried AS (
                UPDATE jobs SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL,
                    last_status = NULL, locked_by = NULL, lease_expires_at = NULL
                WHERE lane = \(lane.rawValue) AND state IN ('available', 'retryable', 'discarded')
                  AND ((\(id)::bigint IS NOT NULL AND id = \(id)) OR (\(discarded) AND state = 'discarded'))
                RETURNING id
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger)
        if count > 0 { try await notify(lane) }
        return count
    }

    /// Tells `lane`'s workers (NOTIFY `siwa_jobs`) that jobs were put back outside a producer's
    /// statement (a producer's own statement notifies through `notifySQL`).
    func notify(_ lane: Lane) async throws {
        try await client.bounded.query("SELECT pg_notify('siwa_jobs', \(lane.rawValue))", logger: logger)
    }
}
