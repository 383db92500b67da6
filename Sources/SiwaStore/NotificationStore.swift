import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// What recording a verified notification did.
package enum RecordOutcome: Sendable, Equatable {
    /// Newly stored (and its job enqueued when it has an effect), durably committed.
    case accepted(jti: String, status: ProcessingStatus)
    /// Already stored under this jti, or the same event under another jti: `jti` is the stored one.
    case duplicate(jti: String)
}

/// A notification row as the CLI and (later) the API show it.
package struct NotificationSummary: Sendable, Codable, Equatable {
    package var jti: String
    package var aud: String
    package var type: String?
    package var rawType: String?
    package var sub: String?
    package var eventTime: Date?
    package var receivedAt: Date
    package var status: ProcessingStatus
    package var skipReason: String?
    package var deliveries: Int
}

package struct NotificationFilter: Sendable {
    package var sub: String?
    package var aud: String?
    package var type: String?
    package var status: ProcessingStatus?
    package var limit: Int = 50
    package init(sub: String? = nil, aud: String? = nil, type: String? = nil, status: ProcessingStatus? = nil, limit: Int = 50) {
        self.sub = sub
        self.aud = aud
        self.type = type
        self.status = status
        self.limit = limit
    }
}

/// Every SQL statement about notifications (their effect jobs enqueued through `JobQueue`),
/// rejections and the persisted key set.
package struct NotificationStore: Sendable {
    package let client: PostgresClient
    let logger: Logger
    /// Told after each commit that enqueued jobs.
    package let jobsNotifier: JobsNotifier

    /// `keepConnections`: the notifier keeps its connection while busy (see `KeptConnection`).
    package init(client: PostgresClient, keepConnections: Bool = false, logger: Logger) {
        self.client = client
        self.logger = logger
        self.jobsNotifier = JobsNotifier(client: client, keepConnection: keepConnections, logger: logger)
    }

    // MARK: NotificationsRecord

    /// A verified notification ready to be recorded.
    package struct Incoming: Sendable {
        package var notification: VerifiedNotification
        package var rawJWS: String
        package var receivedAt: Date
        package var remoteAddress: String?

        package init(notification: VerifiedNotification, rawJWS: String, receivedAt: Date, remoteAddress: String?) {
            self.notification = notification
            self.rawJWS = rawJWS
            self.receivedAt = receivedAt
            self.remoteAddress = remoteAddress
        }
    }

    /// Records one notification (a batch of one). The receiver goes through `GroupCommitter`.
    package func record(_ notification: VerifiedNotification, rawJWS: String, receivedAt: Date, remoteAddress: String?) async throws -> RecordOutcome {
        let outcomes = try await record([Incoming(notification: notification, rawJWS: rawJWS, receivedAt: receivedAt, remoteAddress: remoteAddress)])
        guard let outcome = outcomes[0] else { throw StoreError.conflictUnresolved(jti: notification.jti) }
        return outcome
    }

    /// Stores a batch of verified notifications and enqueues their jobs in one transaction — one
    /// multi-row insert, one commit (so one WAL flush) for all — and returns after `COMMIT` has
    /// answered. With the extended protocol a statement's rows arrive before the implicit commit at
    /// Sync, so they prove nothing; COMMIT's completion is sent only after the commit record is
    /// flushed (`synchronous_commit` on: the insert raises a lower default). The insert and the
    /// duplicate count are prepared once per connection and take the batch as one array per column.
    ///
    /// Each outcome is `accepted` (inserted now), `duplicate` (same jti, or the same
    /// aud/sub/type/event_time under another jti, already stored — its deliveries are counted), or
    /// nil when neither could be decided in this snapshot (a copy committed concurrently by another
    /// process): the caller submits it again. Idle workers are told after the commit. `kept`: the
    /// connection to commit on (the group committer's), else one leased for this batch.
    package func record(_ batch: [Incoming], kept: KeptConnection? = nil) async throws -> [RecordOutcome?] {
        guard !batch.isEmpty else { return [] }
        let logger = self.logger
        let insert: @Sendable (PostgresConnection) async throws -> ([RecordOutcome?], Int) = { connection in
            var outcomes = [RecordOutcome?](repeating: nil, count: batch.count)
            var firstIndexOfJTI: [String: Int] = [:]
            for (index, item) in batch.enumerated() where firstIndexOfJTI[item.notification.jti] == nil {
                firstIndexOfJTI[item.notification.jti] = index
            }
            var jobs = 0
            for try await (jti, status) in try await connection.execute(InsertBatch(batch), logger: logger) {
                if status == ProcessingStatus.pending.rawValue { jobs += 1 }
                if let index = firstIndexOfJTI[jti] {
                    outcomes[index] = .accepted(jti: jti, status: ProcessingStatus(rawValue: status) ?? .pending)
                }
            }
            let rest = batch.indices.filter { outcomes[$0] == nil }
            guard !rest.isEmpty else { return (outcomes, jobs) }
            let duplicates = CountDuplicates(indices: rest, batch: batch, lastDelivery: batch.map(\.receivedAt).max()!)
            for try await (index, jti) in try await connection.execute(duplicates, logger: logger) {
                outcomes[index] = .duplicate(jti: jti)
            }
            return (outcomes, jobs)
        }
        let (outcomes, jobs) =
            if let kept {
                try await kept.transaction(logger: logger, insert)
            } else {
                try await client.bounded.transaction(logger: logger, insert)
            }
        if jobs > 0 { jobsNotifier.jobsEnqueued() }
        return outcomes
    }

    /// NotificationsInsertBatch: input order decides which of two copies in one batch is inserted;
    /// ON CONFLICT DO NOTHING skips the rest (and any already stored). Times travel as integers
    /// (exact) and become timestamptz here. `durable` raises `synchronous_commit` to `on` for this
    /// transaction when the session's default (a role or database setting) is `off` or `local`:
    /// a 200 promises durability whatever the server says; `remote_write`/`remote_apply` stay. It
    /// runs once, before the rows (the final SELECT's one-time filter), without a round trip of its own.
    struct InsertBatch: PostgresPreparedStatement {
        static let name = "siwa_notifications_insert_batch_v2"
        static let sql = """
            WITH durable AS (
                SELECT set_config('synchronous_commit', 'on', true) WHERE current_setting('synchronous_commit') IN ('off', 'local')
            ), input AS (
                SELECT * FROM unnest($1::text[], $2::bool[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[],
                    $8::text[], $9::bool[], $10::text[], $11::text[], $12::text[], $13::text[], $14::int8[], $15::int8[],
                    $16::text[], $17::text[], $18::text[], $19::int8[], $20::text[])
                WITH ORDINALITY AS r(jti, jti_derived, aud, sub, type, raw_type, event_time_ms, email, is_private_email, status,
                    skip_reason, skip_detail, kid, issued_at, expires_at, raw_jws, header, claims, received_at_us, remote_addr, idx)
            ), ins AS (
                INSERT INTO notifications (
                    jti, jti_derived, aud, sub, type, raw_type, event_time, email, is_private_email, status, skip_reason,
                    skip_detail, kid, issued_at, expires_at, raw_jws, header, claims, received_at, remote_addr, last_delivery_at)
                SELECT jti, jti_derived, aud, sub, type, raw_type, timestamptz 'epoch' + event_time_ms * interval '1 millisecond',
                    email, is_private_email, status::notification_status, skip_reason, skip_detail, kid,
                    timestamptz 'epoch' + issued_at * interval '1 second', timestamptz 'epoch' + expires_at * interval '1 second',
                    raw_jws, header::jsonb, claims::jsonb, timestamptz 'epoch' + received_at_us * interval '1 microsecond', remote_addr,
                    timestamptz 'epoch' + received_at_us * interval '1 microsecond'
                FROM input ORDER BY idx
                ON CONFLICT DO NOTHING
                RETURNING id, jti, status, aud, sub, event_time
            ), job AS (
                \(JobQueue.Effects.enqueueSQL(from: "ins"))
            )
            SELECT jti, status::text FROM ins WHERE (SELECT count(*) FROM durable) >= 0
            """
        typealias Row = (String, String)
        let batch: [Incoming]
        init(_ batch: [Incoming]) { self.batch = batch }

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 20)
            let notifications = batch.map(\.notification)
            let events = notifications.map(\.decoding.event)
            bindings.append(notifications.map(\.jti))
            bindings.append(notifications.map(\.jtiDerived))
            bindings.append(notifications.map(\.aud))
            bindings.append(NullableArray(notifications.map(\.sub)))
            bindings.append(NullableArray(events.map { event in event.map { $0.type?.rawValue ?? $0.rawType } }))
            bindings.append(NullableArray(events.map { $0?.rawType }))
            bindings.append(NullableArray(events.map { $0?.eventTimeMillis }))
            bindings.append(NullableArray(events.map { $0?.email }))
            bindings.append(NullableArray(events.map { $0?.isPrivateEmail }))
            var statuses: [String] = [], skipReasons: [String?] = [], skipDetails: [String?] = []
            for notification in notifications {
                switch notification.decoding {
                case .event:
                    statuses.append(ProcessingStatus.pending.rawValue)
                    skipReasons.append(nil)
                    skipDetails.append(nil)
                case .skipped(let reason, let detail, _):
                    statuses.append(ProcessingStatus.skipped.rawValue)
                    skipReasons.append(reason.rawValue)
                    skipDetails.append(detail)
                }
            }
            bindings.append(statuses)
            bindings.append(NullableArray(skipReasons))
            bindings.append(NullableArray(skipDetails))
            bindings.append(notifications.map(\.kid))
            bindings.append(notifications.map(\.issuedAt))
            bindings.append(NullableArray(notifications.map(\.expiresAt)))
            bindings.append(batch.map(\.rawJWS))
            bindings.append(notifications.map(\.headerJSON))
            bindings.append(notifications.map(\.claimsJSON))
            bindings.append(batch.map { Int64((($0.receivedAt.timeIntervalSince1970) * 1_000_000).rounded()) })
            bindings.append(NullableArray(batch.map(\.remoteAddress)))
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
    }

    /// NotificationsCountDuplicates: a fresh snapshot sees copies committed meanwhile; each copy
    /// adds a delivery to the stored notification.
    struct CountDuplicates: PostgresPreparedStatement {
        static let name = "siwa_notifications_count_duplicates_v1"
        static let sql = """
            WITH input AS (
                SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[])
                    AS r(idx, jti, aud, sub, type, event_time_ms)
            ), matched AS (
                SELECT input.idx, coalesce(
                    (SELECT n.id FROM notifications n WHERE n.jti = input.jti),
                    (SELECT n.id FROM notifications n
                     WHERE n.aud = input.aud AND n.sub = input.sub AND n.type = input.type
                       AND n.event_time = timestamptz 'epoch' + input.event_time_ms * interval '1 millisecond')
                ) AS id
                FROM input
            ), counted AS (
                UPDATE notifications n SET deliveries = n.deliveries + c.copies, last_delivery_at = $7
                FROM (SELECT id, count(*) AS copies FROM matched WHERE id IS NOT NULL GROUP BY id) c
                WHERE n.id = c.id
                RETURNING n.id, n.jti
            )
            SELECT matched.idx, counted.jti FROM matched JOIN counted ON counted.id = matched.id
            """
        typealias Row = (Int, String)
        let indices: [Int]
        let batch: [Incoming]
        let lastDelivery: Date

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 7)
            let events = indices.map { batch[$0].notification.decoding.event }
            bindings.append(indices.map(Int64.init))
            bindings.append(indices.map { batch[$0].notification.jti })
            bindings.append(indices.map { batch[$0].notification.aud })
            bindings.append(NullableArray(events.map { $0?.sub }))
            bindings.append(NullableArray(events.map { event in event.map { $0.type?.rawValue ?? $0.rawType } }))
            bindings.append(NullableArray(events.map { $0?.eventTimeMillis }))
            bindings.append(lastDelivery)
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
    }

    // MARK: NotificationsList

    package func list(_ filter: NotificationFilter) async throws -> [NotificationSummary] {
        var sql = SQLBuilder(
            """
            SELECT jti, aud, type, raw_type, sub, event_time, received_at, status::text, skip_reason, deliveries
            FROM notifications
            """)
        sql.filter("sub =", filter.sub)
        sql.filter("aud =", filter.aud)
        sql.filter("type =", filter.type.map { EventType(apple: $0)?.rawValue ?? $0 })
        sql.filter("status::text =", filter.status?.rawValue)
        sql.append(" ORDER BY received_at DESC, id DESC LIMIT ")
        sql.bind(max(1, min(filter.limit, 10_000)))
        var result: [NotificationSummary] = []
        let rows = try await client.bounded.query(sql.query, logger: logger)
        for try await (jti, aud, type, rawType, sub, eventTime, receivedAt, status, skipReason, deliveries) in rows.decode(
            (String, String, String?, String?, String?, Date?, Date, String, String?, Int).self)
        {
            result.append(
                NotificationSummary(
                    jti: jti, aud: aud, type: type, rawType: rawType, sub: sub, eventTime: eventTime, receivedAt: receivedAt,
                    status: ProcessingStatus(rawValue: status) ?? .pending, skipReason: skipReason, deliveries: deliveries))
        }
        return result
    }

    // MARK: NotificationsErase, NotificationsPrune

    /// Moves a user's notifications to their new `sub` (an app transfer), in the caller's transaction.
    static func rekey(aud: String, from old: String, to new: String, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query("UPDATE notifications SET sub = \(new) WHERE aud = \(aud) AND sub = \(old)", logger: logger)
    }

    /// Erases the users' email address from their notifications that may carry it (email events,
    /// and unknown or missing types): the raw token is redacted (its base64 holds the address) and
    /// the decoded events replaced.
    static func eraseAddresses(of users: [(aud: String, sub: String)], on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            UPDATE notifications n SET email = NULL, erased_at = now(),
                raw_jws = split_part(n.raw_jws, '.', 1) || '.erased.',
                claims = jsonb_set(n.claims, '{events}', to_jsonb('erased'::text))
            WHERE (n.aud, n.sub) IN (SELECT * FROM unnest(\(users.map(\.aud))::text[], \(users.map(\.sub))::text[]))
              AND n.erased_at IS NULL
              AND (n.email IS NOT NULL OR n.type IS NULL OR NOT n.type = ANY(\(EventType.revoking.map(\.rawValue))::text[]))
            """, logger: logger)
    }

    /// Deletes up to `limit` notifications received before `retention` ago (their jobs and attempt
    /// log go with them), oldest first, and the per-minute counts left at zero. One short statement
    /// per call, so ingest never waits on it; callers repeat while it returns a full batch.
    /// Notifications whose effect may still run are kept.
    @discardableResult
    package func prune(retention: Duration, limit: Int = 1000) async throws -> Int {
        let seconds = Int(retention.components.seconds)
        let open = ProcessingStatus.open.map(\.rawValue)
        return try await client.bounded.count(
            """
            WITH old AS (
                SELECT id FROM notifications
                WHERE received_at < now() - \(seconds) * interval '1 second'
                  AND NOT status::text = ANY(\(open)::text[])
                ORDER BY received_at LIMIT \(limit)
            ), pruned AS (
                -- Status again: a replay may have reopened one since this snapshot (its row lock made this wait).
                DELETE FROM notifications WHERE id IN (SELECT id FROM old) AND NOT status::text = ANY(\(open)::text[])
                RETURNING id
            ), emptied AS (
                -- Minutes whose notifications were all pruned (their counts folded to zero).
                DELETE FROM notification_counts WHERE minute < now() - \(seconds) * interval '1 second' AND count = 0
            ), aged AS (
                -- Per-second counts only serve the spike window.
                DELETE FROM notification_counts_recent WHERE second < now() - interval '1 day'
            )
            SELECT count(*)::bigint FROM pruned
            """, logger: logger)
    }

    /// Health: the database answers.
    package func ping() async throws {
        try await client.bounded.query("SELECT 1", logger: logger)
    }
}

package enum StoreError: Error, CustomStringConvertible {
    case conflictUnresolved(jti: String)
    /// A statement that always returns a row returned none.
    case noRow(String)
    package var description: String {
        switch self {
        case .conflictUnresolved(let jti): "could not record or find notification \(jti) after retries"
        case .noRow(let statement): "\(statement) returned no row"
        }
    }
}

/// Builds a statement with optional filters; every value is bound, never spliced into the text.
package struct SQLBuilder {
    private var text: String
    private var bindings = PostgresBindings()
    private var hasWhere = false

    package init(_ base: String) { text = base }

    package mutating func filter(_ condition: String, _ value: (some PostgresNonThrowingEncodable & Sendable)?) {
        guard let value else { return }
        text += hasWhere ? " AND " : " WHERE "
        hasWhere = true
        text += "\(condition) "
        bind(value)
    }

    /// A condition without a bound value (or whose values the caller binds next).
    package mutating func condition(_ condition: String) {
        text += hasWhere ? " AND " : " WHERE "
        hasWhere = true
        text += condition
    }

    package mutating func append(_ fragment: String) { text += fragment }

    package mutating func bind(_ value: some PostgresNonThrowingEncodable & Sendable) {
        bindings.append(value)
        text += "$\(bindings.count)"
    }

    package var query: PostgresQuery { PostgresQuery(unsafeSQL: text, binds: bindings) }
}
