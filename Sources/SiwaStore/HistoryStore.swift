import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// What the history API and CLI ask of stored notifications.
package struct HistoryQuery: Sendable {
    package enum TimeField: String, Sendable, CaseIterable { case receivedAt = "received_at", eventTime = "event_time" }

    package var aud: String?
    package var sub: String?
    package var types: [String] = []
    package var statuses: [String] = []
    package var timeField = TimeField.receivedAt
    package var from: Date?
    package var to: Date?
    package var limit = 100
    /// Keyset position: the (time in µs since 1970, id) of the last row of the previous page. In
    /// whole microseconds, compared in SQL: a group commit gives many rows the same received_at,
    /// so a position that moved by a rounding error would skip or repeat rows.
    package var after: (micros: Int64, id: Int)?

    package init() {}
}

package struct NotificationRecord: Sendable {
    package var id: Int
    package var jti: String
    package var aud: String
    package var sub: String?
    package var type: String?
    package var rawType: String?
    package var status: String
    package var skipReason: String?
    package var eventTime: Date?
    package var receivedAt: Date
    package var deliveries: Int
    package var email: String?
    package var isPrivateEmail: Bool?
    package var erasedAt: Date?
    /// The value of the query's time field in µs since 1970 (for cursors).
    package var sortMicros: Int64
}

package struct NotificationDetail: Sendable {
    package var record: NotificationRecord
    package var kid: String
    package var issuedAt: Date
    package var expiresAt: Date?
    package var lastDeliveryAt: Date
    package var jtiDerived: Bool
    /// The signed header's `alg` and the claims' `iss`, as verified.
    package var algorithm: String?
    package var issuer: String?
    /// The address the delivery came from (after trusted proxies).
    package var remoteAddress: String?
    /// The `sub` the signed token carried (nil when erased or unreadable); `record.sub` is the
    /// user's sub now, which an app transfer may have replaced.
    package var signedSub: String? = nil
    package var attempts: [AttemptRecord]
    package var jobs: [NotificationJob]
}

package struct TimelineEntry: Sendable {
    package var record: NotificationRecord
    package var effect: String?
    package var revokedSessions: Int?
    package var appliedAt: Date?
}

package struct StatsRow: Sendable {
    package var start: Date
    package var type: String
    package var count: Int
}

/// Every query of the event history: one statement each, shaped for the indexes of sql/005.
package struct HistoryStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    private static let columns = """
        id, jti, aud, sub, type, raw_type, status::text, skip_reason, event_time, received_at, deliveries, email, is_private_email, erased_at
        """
    private typealias Row = (Int, String, String, String?, String?, String?, String, String?, Date?, Date, Int, String?, Bool?, Date?, Int64)

    private static func record(_ row: Row) -> NotificationRecord {
        NotificationRecord(
            id: row.0, jti: row.1, aud: row.2, sub: row.3, type: row.4, rawType: row.5, status: row.6, skipReason: row.7, eventTime: row.8,
            receivedAt: row.9, deliveries: row.10, email: row.11, isPrivateEmail: row.12, erasedAt: row.13, sortMicros: row.14)
    }

    // MARK: NotificationsList

    /// Newest first by the query's time field, then id; `limit` rows after the keyset position.
    package func notifications(_ query: HistoryQuery) async throws -> [NotificationRecord] {
        let field = query.timeField.rawValue
        var sql = SQLBuilder("SELECT \(Self.columns), (extract(epoch FROM \(field)) * 1000000)::bigint FROM notifications")
        sql.filter("aud =", query.aud)
        if let sub = query.sub {
            sql.filter("sub = ANY(", try await subsNow(of: sub, aud: query.aud))
            sql.append(")")
        }
        sql.filter("type = ANY(", query.types.isEmpty ? nil : query.types)
        if !query.types.isEmpty { sql.append(")") }
        sql.filter("status::text = ANY(", query.statuses.isEmpty ? nil : query.statuses)
        if !query.statuses.isEmpty { sql.append(")") }
        sql.filter("\(field) >=", query.from)
        sql.filter("\(field) <", query.to)
        if query.timeField == .eventTime { sql.condition("event_time IS NOT NULL") }
        if let after = query.after {
            sql.condition("(\(field), id) < (timestamptz 'epoch' + ")
            sql.bind(after.micros)
            sql.append(" * interval '1 microsecond', ")
            sql.bind(after.id)
            sql.append(")")
        }
        sql.append(" ORDER BY \(field) DESC, id DESC LIMIT ")
        sql.bind(query.limit)
        var records: [NotificationRecord] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(Row.self) {
            records.append(Self.record(row))
        }
        return records
    }

    // MARK: NotificationsGet

    package func notification(jti: String) async throws -> NotificationDetail? {
        var detail: NotificationDetail?
        for try await row in try await client.bounded.query(
            """
            SELECT \(unescaped: Self.columns), 0::bigint, kid, issued_at, expires_at, last_delivery_at, jti_derived,
                header->>'alg', claims->>'iss', remote_addr, (claims->'events')::text
            FROM notifications WHERE jti = \(jti)
            """, logger: logger
        ).decode(
            (Int, String, String, String?, String?, String?, String, String?, Date?, Date, Int, String?, Bool?, Date?, Int64, String, Date, Date?, Date, Bool,
             String?, String?, String?, String?).self
        ) {
            let record = Self.record((row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8, row.9, row.10, row.11, row.12, row.13, row.14))
            detail = NotificationDetail(
                record: record, kid: row.15, issuedAt: row.16, expiresAt: row.17, lastDeliveryAt: row.18, jtiDerived: row.19, algorithm: row.20,
                issuer: row.21, remoteAddress: row.22, signedSub: row.23.flatMap { EventDecoding.subject(of: JSONValue.parse(Array($0.utf8))) },
                attempts: [], jobs: [])
        }
        guard var found = detail else { return nil }
        let queue = JobQueue(client: client, logger: logger)
        found.attempts = try await queue.attempts(notificationID: found.record.id)
        found.jobs = try await queue.jobs(notificationID: found.record.id)
        return found
    }

    /// `sub` and the subs app transfers re-keyed it to (its notifications moved with it): a search
    /// or a timeline by a user's old sub finds their history.
    private func subsNow(of sub: String, aud: String?) async throws -> [String] {
        var subs: [String] = []
        for try await (found,) in try await client.bounded.query(
            """
            WITH RECURSIVE forward (sub, depth) AS (
                SELECT \(sub)::text, 0
                UNION ALL
                SELECT c.new_sub, f.depth + 1 FROM account_sub_changes c JOIN forward f ON c.old_sub = f.sub
                WHERE (\(aud)::text IS NULL OR c.aud = \(aud)) AND f.depth < 16
            )
            SELECT DISTINCT sub FROM forward
            """, logger: logger
        ).decode((String,).self) {
            subs.append(found)
        }
        return subs
    }

    // MARK: Timeline

    /// A user's notifications in event_time order, each with the effect its applied attempt
    /// recorded (nil: not applied yet, skipped, or discarded).
    package func timeline(aud: String, sub: String, limit: Int) async throws -> [TimelineEntry] {
        var entries: [TimelineEntry] = []
        for try await row in try await client.bounded.query(
            """
            SELECT n.id, n.jti, n.aud, n.sub, n.type, n.raw_type, n.status::text, n.skip_reason, n.event_time, n.received_at, n.deliveries,
                n.email, n.is_private_email, n.erased_at, 0::bigint
            FROM notifications n
            WHERE n.aud = \(aud) AND n.sub = ANY(\(try await subsNow(of: sub, aud: aud)))
            ORDER BY n.event_time, n.id
            LIMIT \(limit)
            """, logger: logger
        ).decode(Row.self) {
            entries.append(TimelineEntry(record: Self.record(row), effect: nil, revokedSessions: nil, appliedAt: nil))
        }
        let applied = try await JobQueue(client: client, logger: logger).appliedEffects(notificationIDs: entries.map(\.record.id))
        for index in entries.indices {
            guard let attempt = applied[entries[index].record.id] else { continue }
            entries[index].effect = attempt.effect
            entries[index].revokedSessions = attempt.revokedSessions
            entries[index].appliedAt = attempt.finishedAt
        }
        return entries
    }

    // MARK: RejectionsDeleteKeptTokens

    /// Deletes the whole tokens (their keys, and the body prefix, which holds the same address) of
    /// rejections received before `retention` ago, up to `limit` at a time; the rejection rows stay
    /// (until the history retention). Such a token is another app's genuine notification, kept only
    /// to be replayed after a bundle-ID fix. `now`: the time to count the retention from (nil:
    /// PostgreSQL's; tests pass theirs).
    @discardableResult
    package func deleteKeptTokens(olderThan retention: Duration, limit: Int = 1000, now: Date? = nil) async throws -> Int {
        let seconds = Int(retention.components.seconds)
        return try await client.bounded.count(
            """
            WITH old AS (
                SELECT id FROM rejections
                WHERE token IS NOT NULL AND received_at < coalesce(\(now)::timestamptz, now()) - \(seconds) * interval '1 second'
                ORDER BY received_at LIMIT \(limit)
            ), cleared AS (
                UPDATE rejections SET token = NULL, key_jwk = NULL, body_prefix = ''::bytea WHERE id IN (SELECT id FROM old) RETURNING id
            )
            SELECT count(*)::bigint FROM cleared
            """, logger: logger)
    }

    // MARK: NotificationsStats

    /// Bucket sizes and the default range of a stats query, in seconds.
    package static let buckets: [String: (seconds: Double, defaultRange: Double)] = [
        "minute": (60, 3600), "hour": (3600, 7 * 86_400), "day": (86_400, 90 * 86_400),
    ]

    /// Counts per `bucket` (minute, hour, day) of received_at and type, oldest first, for the
    /// minutes that start in [from rounded down to the minute, to). Read from the per-minute counts
    /// (006_stats_rollup.sql) plus the deltas not folded yet: exact, without touching notifications.
    package func stats(bucket: String, from: Date, to: Date, aud: String?, types: [String]) async throws -> [StatsRow] {
        var rows: [StatsRow] = []
        for try await row in try await client.bounded.query(
            """
            SELECT date_trunc(\(bucket), minute, 'UTC') AS start, type, sum(n)::bigint
            FROM (
                SELECT minute, aud, type, count AS n FROM notification_counts
                WHERE minute >= date_trunc('minute', \(from), 'UTC') AND minute < \(to)
                UNION ALL
                SELECT date_trunc('minute', second, 'UTC'), aud, type, delta FROM notification_count_deltas
                WHERE second >= date_trunc('minute', \(from), 'UTC') AND second < \(to)
            ) counts
            WHERE (\(aud)::text IS NULL OR aud = \(aud)) AND (cardinality(\(types)::text[]) = 0 OR type = ANY(\(types)::text[]))
            GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2
            """, logger: logger
        ).decode((Date, String, Int).self) {
            rows.append(StatsRow(start: row.0, type: row.1, count: row.2))
        }
        return rows
    }

    package static let foldLimit = 20_000

    /// Folds up to `limit` deltas appended by the count triggers into notification_counts (the
    /// workers' maintenance, every few seconds). Safe to run from several processes at once: each
    /// delta is deleted, and so added, once. Returns how many deltas it folded.
    @discardableResult
    package func foldCounts(limit: Int = foldLimit) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH moved AS (
                DELETE FROM notification_count_deltas
                WHERE ctid = ANY(ARRAY(SELECT ctid FROM notification_count_deltas LIMIT \(limit)))
                RETURNING second, aud, type, delta
            ), minutes AS (
                INSERT INTO notification_counts AS c (minute, aud, type, count)
                SELECT date_trunc('minute', second, 'UTC'), aud, type, sum(delta) FROM moved GROUP BY 1, 2, 3
                ON CONFLICT (minute, aud, type) DO UPDATE SET count = c.count + excluded.count
            ), seconds AS (
                INSERT INTO notification_counts_recent AS c (second, aud, type, count)
                SELECT second, aud, type, sum(delta) FROM moved WHERE second > now() - interval '1 day' GROUP BY 1, 2, 3
                ON CONFLICT (second, aud, type) DO UPDATE SET count = c.count + excluded.count
            ), seen AS (
                INSERT INTO app_first_seen AS f (aud, first_seen, last_seen)
                SELECT aud, min(second), max(second) FROM moved WHERE delta > 0 GROUP BY aud
                ON CONFLICT (aud) DO UPDATE
                SET first_seen = least(f.first_seen, excluded.first_seen), last_seen = greatest(f.last_seen, excluded.last_seen)
                WHERE excluded.first_seen < f.first_seen OR f.last_seen IS NULL OR excluded.last_seen > f.last_seen
            )
            SELECT count(*)::bigint FROM moved
            """, logger: logger)
    }
}

/// What the alert rules read of the rollup `foldCounts` writes: revocation counts for
/// `revocation_spike`, arrivals and their spans for `quiet_app`.
extension HistoryStore {
    // MARK: SpikeCounts

    /// Counts of consent-revoked and account-delete per app with any in the window ending `now`:
    /// the window's (per second, from the recent rollup and the deltas not folded yet) and the 7
    /// day-hours of the baseline (per minute). An app or type absent had none in the window.
    package func spikeCounts(now: Date, window: Duration) async throws -> [SpikeCounts] {
        let ranges = SpikeRule.ranges(now: now, window: window)
        let from = ranges.window.lowerBound
        var byKey: [String: SpikeCounts] = [:]
        let revoking = EventType.revoking.map(\.rawValue)
        for try await (index, aud, type, count) in try await client.bounded.query(
            """
            WITH win AS (
                SELECT aud, type, sum(n)::bigint AS n FROM (
                    SELECT aud, type, count AS n FROM notification_counts_recent
                    WHERE second >= \(from) AND second < \(now) AND type = ANY(\(revoking)::text[])
                    UNION ALL
                    SELECT aud, type, delta FROM notification_count_deltas
                    WHERE second >= \(from) AND second < \(now) AND type = ANY(\(revoking)::text[])
                ) w GROUP BY aud, type HAVING sum(n) > 0
            ), days AS (
                SELECT i::int AS idx, lo, hi
                FROM unnest(\(ranges.days.map(\.lowerBound))::timestamptz[], \(ranges.days.map(\.upperBound))::timestamptz[]) WITH ORDINALITY AS r(lo, hi, i)
            )
            SELECT 0, aud, type, n FROM win
            UNION ALL
            SELECT d.idx, c.aud, c.type, sum(c.count)::bigint
            FROM days d JOIN notification_counts c ON c.minute >= d.lo AND c.minute < d.hi
            WHERE c.type = ANY(\(revoking)::text[]) AND c.aud IN (SELECT aud FROM win)
            GROUP BY d.idx, c.aud, c.type
            """, logger: logger
        ).decode((Int, String, String, Int).self) {
            let key = aud + "\u{0}" + type
            var entry = byKey[key] ?? SpikeCounts(aud: aud, type: type, window: 0, days: Array(repeating: 0, count: SpikeRule.historyDays))
            if index == 0 { entry.window = count } else { entry.days[index - 1] = count }
            byKey[key] = entry
        }
        return byKey.values.sorted { ($0.aud, $0.type) < ($1.aud, $1.type) }
    }

    /// When each app's first notification arrived (apps absent: none folded yet — new).
    package func firstSeen(auds: [String]) async throws -> [String: Date] {
        var result: [String: Date] = [:]
        for try await (aud, date) in try await client.bounded.query(
            "SELECT aud, first_seen FROM app_first_seen WHERE aud = ANY(\(auds)::text[])", logger: logger
        ).decode((String, Date).self) {
            result[aud] = date
        }
        return result
    }

    // MARK: QuietApps

    /// When each app (of `auds`, or every app heard from when empty) was first and last heard
    /// from, counting accepted notifications only (the fold's, plus the deltas not folded yet).
    package func arrivals(auds: [String]) async throws -> [(aud: String, firstSeen: Date, lastArrival: Date)] {
        var result: [(aud: String, firstSeen: Date, lastArrival: Date)] = []
        for try await (aud, first, last) in try await client.bounded.query(
            """
            SELECT f.aud, f.first_seen, greatest(coalesce(f.last_seen, f.first_seen), d.last)
            FROM app_first_seen f
            LEFT JOIN LATERAL (SELECT max(second) AS last FROM notification_count_deltas WHERE aud = f.aud AND delta > 0) d ON true
            WHERE cardinality(\(auds)::text[]) = 0 OR f.aud = ANY(\(auds)::text[])
            ORDER BY f.aud
            """, logger: logger
        ).decode((String, Date, Date).self) {
            result.append((aud, first, last))
        }
        return result
    }

    /// Per app and hour of the week (0: Monday 00:00 UTC), the 10-minute spans within `history`
    /// that had an accepted notification (`QuietRule`'s history; read once an hour).
    package func activeSpans(auds: [String], history: Range<Date>) async throws -> [String: [Int: Int]] {
        var result: [String: [Int: Int]] = [:]
        for try await (aud, slot, spans) in try await client.bounded.query(
            """
            SELECT aud, ((extract(isodow FROM span AT TIME ZONE 'UTC')::int - 1) * 24 + extract(hour FROM span AT TIME ZONE 'UTC')::int), count(*)::bigint
            FROM (
                SELECT DISTINCT aud, date_bin(interval '10 minutes', minute, timestamptz '2000-01-03 00:00:00+00') AS span
                FROM notification_counts
                WHERE minute >= \(history.lowerBound) AND minute < \(history.upperBound) AND count > 0 AND aud = ANY(\(auds)::text[])
            ) spans
            GROUP BY 1, 2
            """, logger: logger
        ).decode((String, Int, Int).self) {
            result[aud, default: [:]][slot] = spans
        }
        return result
    }
}
