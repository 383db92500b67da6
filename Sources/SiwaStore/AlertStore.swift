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

/// The `alerts` table: episodes opened, grown and closed, the test alert, the list. Sink messages
/// go to the queue's `alerts` lane (`JobQueue`) in the same transaction, unless a silence
/// (`AlertSilenceStore`) covers the alert. The evaluator's lease is `LeaseStore`'s; what each rule
/// reads lives beside what it reads.
package struct AlertStore: Sendable {
    package let client: PostgresClient
    package let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: AlertsOpen, AlertsRecord

    package func open() async throws -> [AlertRecord] {
        try await list(state: "firing", limit: 10_000)
    }

    /// Opens an episode: the alert row, and one message per sink unless a silence covers it.
    /// Returns the record, or nil when a concurrent evaluator opened the same episode first.
    package func fire(_ episode: AlertEpisode, window: Duration, sinks: @escaping @Sendable (AlertMessage) -> [SinkMessage]) async throws -> AlertRecord? {
        try await client.bounded.transaction(logger: logger) { connection -> AlertRecord? in
            let silence = try await AlertSilenceStore.covering(episode.key, on: connection, logger: logger)
            var inserted: (Int, Int?)?
            for try await row in try await connection.query(
                """
                INSERT INTO alerts (kind, aud, type, series, state, started_at, window_seconds, value, peak, baseline, threshold, silenced_by)
                VALUES (\(episode.key.kind.rawValue), \(episode.key.aud), \(episode.key.type), \(episode.series)::text[], 'firing', \(episode.startedAt),
                    \(Int(window.timeInterval.rounded())), \(episode.value), \(episode.peak), \(episode.baseline), \(episode.threshold), \(silence))
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
            var firedSilenced: Bool?
            for try await (silencedBy,) in try await connection.query(
                """
                UPDATE alerts SET series = \(episode.series)::text[], value = \(episode.value), peak = \(episode.peak),
                    baseline = \(episode.baseline), threshold = \(episode.threshold), normal_since = \(episode.normalSince)
                WHERE id = \(record.id) AND state = 'firing' AND NOT series @> \(joined)::text[]
                RETURNING silenced_by
                """, logger: logger
            ).decode((Int?,).self) {
                firedSilenced = silencedBy != nil
            }
            guard let firedSilenced else { return .alreadyJoined }
            if firedSilenced { return .silenced }
            if try await AlertSilenceStore.covering(episode.key, on: connection, logger: logger) != nil { return .silenced }
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

extension AlertStore {
    /// The deliveries of alert `alertID`, one per sink (`JobQueue.alertDeliveries`).
    package func deliveries(alertID: Int) async throws -> [AlertDelivery] {
        try await JobQueue(client: client, logger: logger).alertDeliveries(alertID: alertID)
    }
}
