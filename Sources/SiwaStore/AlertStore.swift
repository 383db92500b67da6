import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A stored alert (one episode).
package struct AlertRecord: Sendable {
    package var id: Int
    package var state: String
    package var window: Duration
    package var resolvedAt: Date?
    package var episode: AlertEpisode
    package var silencedBy: Int?

    package var message: AlertMessage { AlertMessage(id: id, episode: episode, window: window, resolvedAt: resolvedAt) }
}

/// A silence: no sink hears about alerts of `kind` (for `aud`, or every app) until `until`.
package struct AlertSilence: Sendable {
    package var id: Int
    package var kind: AlertKind
    package var aud: String?
    package var until: Date
    package var createdAt: Date
    package var createdBy: String
    package var reason: String?
}

/// Every SQL statement of alerting: the evaluator's lease, the counts it reads, episodes and
/// silences. Sink messages go to the queue's `alerts` lane (`JobQueue`), in the same transaction.
package struct AlertStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: LeasesAcquire

    /// Takes or renews the lease `name` for `holder` for `ttl`; false while another holder's
    /// lease runs. `now`: the lease's clock (nil: PostgreSQL's, which every process shares).
    package func acquire(lease name: String, holder: String, ttl: Duration, now: Date? = nil) async throws -> Bool {
        var held = false
        for try await (_,) in try await client.bounded.query(
            """
            INSERT INTO leases AS l (name, holder, expires_at)
            VALUES (\(name), \(holder), coalesce(\(now)::timestamptz, now()) + \(Int(ttl.milliseconds)) * interval '1 millisecond')
            ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
            WHERE l.holder = excluded.holder OR l.expires_at < coalesce(\(now)::timestamptz, now())
            RETURNING holder
            """, logger: logger
        ).decode((String,).self) {
            held = true
        }
        return held
    }

    /// Gives the lease up (graceful shutdown), so another process takes over at once.
    package func release(lease name: String, holder: String) async throws {
        try await client.bounded.query("DELETE FROM leases WHERE name = \(name) AND holder = \(holder)", logger: logger)
    }

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

    /// Deliveries rejected since `since` (recorded or sampled out), by reason.
    package func rejections(since: Date) async throws -> [String: Int] {
        var result: [String: Int] = [:]
        for try await (reason, count) in try await client.bounded.query(
            """
            SELECT reason, sum(recorded + sampled_out)::bigint FROM rejection_counts
            WHERE minute >= date_trunc('minute', \(since)) GROUP BY reason HAVING sum(recorded + sampled_out) > 0
            """, logger: logger
        ).decode((String, Int).self) {
            result[reason] = count
        }
        return result
    }

    // MARK: OperationalSignals

    /// The operational alerts' inputs since `since`: seconds the oldest ready job (any lane) has
    /// waited, jobs discarded (both from the queue), deliveries refused for a bad signature
    /// (recorded or sampled out), and calls Apple refused with `invalid_client`; the queue's wait
    /// is measured at `now` (nil: PostgreSQL's).
    package func operationalSignals(since: Date, now: Date? = nil) async throws -> OperationalSignals {
        let queue = try await JobQueue(client: client, logger: logger).signals(since: since, now: now)
        var signals = OperationalSignals(queueLag: queue.queueLag, discardedByLane: queue.discarded)
        for try await (bad, refused) in try await client.bounded.query(
            """
            SELECT coalesce((SELECT sum(recorded + sampled_out) FROM rejection_counts
                             WHERE reason IN ('bad_signature', 'unknown_key') AND minute >= date_trunc('minute', \(since))), 0)::bigint,
                (SELECT count(*) FROM apple_auth_calls WHERE at >= \(since) AND error = \(AppleAuthError.invalidClient.word))::bigint
            """, logger: logger
        ).decode((Int, Int).self) {
            signals.badSignatures = bad
            signals.appleInvalidClient = refused
        }
        return signals
    }

    /// Jobs not completed, per lane and state (`JobQueue.depth`).
    package func queueDepth() async throws -> [JobQueue.Depth] {
        try await JobQueue(client: client, logger: logger).depth()
    }

    // MARK: AlertsOpen, AlertsRecord

    package func open() async throws -> [AlertRecord] {
        try await list(state: "firing", limit: 10_000)
    }

    /// Opens an episode: the alert row, and one message per sink unless a silence covers it.
    /// Returns the record, or nil when a concurrent evaluator opened the same episode first.
    package func fire(_ episode: AlertEpisode, window: Duration, sinks: @escaping @Sendable (AlertMessage) -> [SinkMessage]) async throws -> AlertRecord? {
        try await client.bounded.transaction(logger: logger) { connection -> AlertRecord? in
            var inserted: (Int, Int?)?
            for try await row in try await connection.query(
                """
                WITH silence AS (
                    SELECT id FROM alert_silences
                    WHERE kind = \(episode.key.kind.rawValue) AND (aud IS NULL OR aud = \(episode.key.aud)) AND until > now()
                    ORDER BY until DESC LIMIT 1
                )
                INSERT INTO alerts (kind, aud, type, series, state, started_at, window_seconds, value, peak, baseline, threshold, silenced_by)
                VALUES (\(episode.key.kind.rawValue), \(episode.key.aud), \(episode.key.type), \(episode.series)::text[], 'firing', \(episode.startedAt),
                    \(Int(window.timeInterval.rounded())), \(episode.value), \(episode.peak), \(episode.baseline), \(episode.threshold),
                    (SELECT id FROM silence))
                ON CONFLICT DO NOTHING
                RETURNING id, silenced_by
                """, logger: logger
            ).decode((Int, Int?).self) {
                inserted = row
            }
            guard let (id, silencedBy) = inserted else { return nil }
            let record = AlertRecord(id: id, state: "firing", window: window, resolvedAt: nil, episode: episode, silencedBy: silencedBy)
            if silencedBy == nil { try await JobQueue.enqueueAlerts(sinks(record.message), alertID: id, on: connection, logger: logger) }
            return record
        }
    }

    /// Writes an open episode's new figures (peak, normal since, a series joined silently).
    package func update(_ id: Int, _ episode: AlertEpisode) async throws {
        try await client.bounded.query(
            """
            UPDATE alerts SET value = \(episode.value), peak = \(episode.peak), baseline = \(episode.baseline), threshold = \(episode.threshold),
                normal_since = \(episode.normalSince), series = \(episode.series)::text[]
            WHERE id = \(id) AND state = 'firing'
            """, logger: logger)
    }

    /// What `join` did.
    package enum JoinOutcome: Sendable, Equatable {
        /// Recorded, and an `updated` message queued for each sink.
        case told
        /// Recorded; no sink told (the episode fired silenced, or a silence covers it now).
        case silenced
        /// Nothing: the episode is closed, or a concurrent evaluator joined these series first.
        case alreadyJoined
    }

    /// Writes the series that joined an open episode (`joined`) with its new figures, and tells
    /// the sinks in an `updated` message unless the episode fired silenced or a silence covers it
    /// now (updates are noise a silence is asked to stop; the resolve still closes what was told).
    @discardableResult
    package func join(_ record: AlertRecord, joined: [String], sinks: @escaping @Sendable (AlertMessage) -> [SinkMessage]) async throws -> JoinOutcome {
        let episode = record.episode
        return try await client.bounded.transaction(logger: logger) { connection -> JoinOutcome in
            var silenced: Bool?
            for try await (silence,) in try await connection.query(
                """
                UPDATE alerts SET series = \(episode.series)::text[], value = \(episode.value), peak = \(episode.peak),
                    baseline = \(episode.baseline), threshold = \(episode.threshold), normal_since = \(episode.normalSince)
                WHERE id = \(record.id) AND state = 'firing' AND NOT series @> \(joined)::text[]
                RETURNING coalesce(silenced_by, (
                    SELECT id FROM alert_silences
                    WHERE kind = alerts.kind AND (aud IS NULL OR aud = alerts.aud) AND until > now()
                    ORDER BY until DESC LIMIT 1))
                """, logger: logger
            ).decode((Int?,).self) {
                silenced = silence != nil
            }
            guard let silenced else { return .alreadyJoined }
            if silenced { return .silenced }
            let message = AlertMessage(id: record.id, episode: episode, window: record.window, resolvedAt: nil, joined: joined)
            try await JobQueue.enqueueAlerts(sinks(message), alertID: record.id, on: connection, logger: logger)
            return .told
        }
    }

    /// Closes an episode and tells the sinks (unless it fired silenced: nobody heard of it).
    package func resolve(_ record: AlertRecord, at: Date, sinks: @escaping @Sendable (AlertMessage) -> [SinkMessage]) async throws {
        try await client.bounded.transaction(logger: logger) { connection in
            var resolved = false
            for try await (_,) in try await connection.query(
                """
                UPDATE alerts SET state = 'resolved', resolved_at = \(at), value = \(record.episode.value), normal_since = \(record.episode.normalSince)
                WHERE id = \(record.id) AND state = 'firing' RETURNING id
                """, logger: logger
            ).decode((Int,).self) {
                resolved = true
            }
            guard resolved, record.silencedBy == nil else { return }
            var message = record.message
            message.resolvedAt = at
            try await JobQueue.enqueueAlerts(sinks(message), alertID: record.id, on: connection, logger: logger)
        }
    }

    /// `alerts test`: a test alert (stored resolved, so it never shows as open) and one message
    /// per sink. Returns the alert id.
    package func test(window: Duration, sinks: @escaping @Sendable (AlertMessage) -> [SinkMessage]) async throws -> Int {
        try await client.bounded.transaction(logger: logger) { connection -> Int in
            var id = 0
            for try await (n, started) in try await connection.query(
                """
                INSERT INTO alerts (kind, state, started_at, resolved_at, window_seconds, value, peak, threshold)
                VALUES ('test', 'resolved', now(), now(), \(Int(window.timeInterval.rounded())), 1, 1, 1)
                RETURNING id, started_at
                """, logger: logger
            ).decode((Int, Date).self) {
                id = n
                let episode = AlertEpisode(key: AlertKey(kind: .test), startedAt: started, value: 1, peak: 1, baseline: nil, threshold: 1)
                let messages = sinks(AlertMessage(id: n, episode: episode, window: window, resolvedAt: nil))
                try await JobQueue.enqueueAlerts(messages, alertID: n, on: connection, logger: logger)
            }
            return id
        }
    }

    // MARK: AlertsList

    /// Newest first; `state` firing or resolved (nil: both).
    package func list(state: String?, limit: Int) async throws -> [AlertRecord] {
        var sql = SQLBuilder(
            """
            SELECT id, kind, aud, type, series, state, started_at, resolved_at, window_seconds, value, peak, baseline, threshold, normal_since, silenced_by
            FROM alerts
            """)
        sql.filter("state =", state)
        sql.append(" ORDER BY started_at DESC, id DESC LIMIT ")
        sql.bind(max(1, min(limit, 10_000)))
        var result: [AlertRecord] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(
            (Int, String, String?, String?, [String], String, Date, Date?, Int, Int, Int, Double?, Double, Date?, Int?).self)
        {
            let key = AlertKey(kind: AlertKind(rawValue: row.1) ?? .test, aud: row.2, type: row.3)
            let episode = AlertEpisode(
                key: key, series: row.4, startedAt: row.6, value: row.9, peak: row.10, baseline: row.11, threshold: row.12, normalSince: row.13)
            result.append(AlertRecord(id: row.0, state: row.5, window: .seconds(row.8), resolvedAt: row.7, episode: episode, silencedBy: row.14))
        }
        return result
    }

    // MARK: SilencesCreate, SilencesList

    package func silence(kind: AlertKind, aud: String?, for duration: Duration, by actor: String, reason: String?) async throws -> AlertSilence {
        var silence: AlertSilence?
        for try await row in try await client.bounded.query(
            """
            INSERT INTO alert_silences (kind, aud, until, created_by, reason)
            VALUES (\(kind.rawValue), \(aud), now() + \(Int(duration.milliseconds)) * interval '1 millisecond', \(actor), \(reason))
            RETURNING id, until, created_at
            """, logger: logger
        ).decode((Int, Date, Date).self) {
            silence = AlertSilence(id: row.0, kind: kind, aud: aud, until: row.1, createdAt: row.2, createdBy: actor, reason: reason)
        }
        guard let silence else { throw StoreError.noRow("alert_silences insert") }
        return silence
    }

    /// Silences still running (and, with `expired`, the last day's ended ones too), newest first.
    package func silences(includeExpired: Bool) async throws -> [AlertSilence] {
        var result: [AlertSilence] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, kind, aud, until, created_at, created_by, reason FROM alert_silences
            WHERE until > now() - CASE WHEN \(includeExpired) THEN interval '1 day' ELSE interval '0' END
            ORDER BY created_at DESC, id DESC LIMIT 1000
            """, logger: logger
        ).decode((Int, String, String?, Date, Date, String, String?).self) {
            result.append(
                AlertSilence(id: row.0, kind: AlertKind(rawValue: row.1) ?? .test, aud: row.2, until: row.3, createdAt: row.4, createdBy: row.5, reason: row.6))
        }
        return result
    }
}

extension AlertRecord {
    /// The API's and the CLI's --json shape: the webhook message (`series` naming every series of
    /// the episode) plus state and silence.
    package var json: JSONValue {
        var object = message.json.objectValue ?? [:]
        object["value"] = .number(Double(episode.value))
        object["normal_since"] = episode.normalSince.map { .string(iso8601($0)) } ?? .null
        object["silenced"] = .bool(silencedBy != nil)
        return .object(object)
    }
}

extension AlertSilence {
    package var json: JSONValue {
        [
            "id": .number(Double(id)), "kind": .string(kind.rawValue), "aud": aud.map(JSONValue.string) ?? .null,
            "until": .string(iso8601(until)), "created_at": .string(iso8601(createdAt)), "created_by": .string(createdBy),
            "reason": reason.map(JSONValue.string) ?? .null,
        ]
    }
}

extension AlertStore {
    /// The deliveries of alert `alertID`, one per sink (`JobQueue.alertDeliveries`).
    package func deliveries(alertID: Int) async throws -> [AlertDelivery] {
        try await JobQueue(client: client, logger: logger).alertDeliveries(alertID: alertID)
    }
}
