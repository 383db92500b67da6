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

/// Every SQL statement about notifications, their jobs, rejections and the persisted key set.
package struct NotificationStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
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
    /// multi-row insert, one duplicate-count update, one commit (so one WAL flush) for all — and
    /// returns after `COMMIT` has answered. With the extended protocol a statement's rows arrive
    /// before the implicit commit at Sync, so they prove nothing; COMMIT's completion is sent only
    /// after the commit record is flushed (synchronous_commit on).
    ///
    /// Each outcome is `accepted` (inserted now), `duplicate` (same jti, or the same
    /// aud/sub/type/event_time under another jti, already stored — its deliveries are counted), or
    /// nil when neither could be decided in this snapshot (a copy committed concurrently by another
    /// process): the caller submits it again.
    package func record(_ batch: [Incoming]) async throws -> [RecordOutcome?] {
        guard !batch.isEmpty else { return [] }
        let rows = JSONValue.array(batch.enumerated().map { index, item in Self.row(index: index, item) }).jsonText
        let lastDelivery = batch.map(\.receivedAt).max()!
        let logger = self.logger
        return try await client.transaction(logger: logger) { connection -> [RecordOutcome?] in
            var outcomes = [RecordOutcome?](repeating: nil, count: batch.count)
            var firstIndexOfJTI: [String: Int] = [:]
            for (index, item) in batch.enumerated() where firstIndexOfJTI[item.notification.jti] == nil {
                firstIndexOfJTI[item.notification.jti] = index
            }
            // NotificationsInsertBatch: input order decides which of two copies in one batch is
            // inserted; ON CONFLICT DO NOTHING skips the rest (and any already stored).
            for try await (jti, status, _) in try await connection.query(
                """
                WITH input AS (\(Self.inputRows)),
                ins AS (
                    INSERT INTO notifications (
                        jti, jti_derived, aud, sub, type, raw_type, event_time, email, is_private_email, status, skip_reason,
                        skip_detail, kid, issued_at, expires_at, raw_jws, header, claims, received_at, remote_addr, last_delivery_at)
                    SELECT jti, jti_derived, aud, sub, type, raw_type, event_time, email, is_private_email, status, skip_reason,
                        skip_detail, kid, issued_at, expires_at, raw_jws, header, claims, received_at, remote_addr, received_at
                    FROM input ORDER BY idx
                    ON CONFLICT DO NOTHING
                    RETURNING id, jti, status, aud, sub, event_time
                ), job AS (
                    INSERT INTO jobs (notification_id, run_at, aud, sub, event_time)
                    SELECT id, now(), aud, sub, event_time FROM ins WHERE status = 'pending'
                    RETURNING id
                ), wake AS (
                    -- A hint for idle workers, delivered at COMMIT; they poll as well (NOTIFY is
                    -- lost when nobody listens, and poolers drop it).
                    SELECT pg_notify('siwa_jobs', '') FROM (SELECT 1 FROM job LIMIT 1) j
                )
                SELECT jti, status::text, (SELECT count(*) FROM job) + (SELECT count(*) FROM wake) * 0 FROM ins
                """.bound(rows), logger: logger
            ).decode((String, String, Int).self) {
                if let index = firstIndexOfJTI[jti] {
                    outcomes[index] = .accepted(jti: jti, status: ProcessingStatus(rawValue: status) ?? .pending)
                }
            }
            let rest = batch.indices.filter { outcomes[$0] == nil }
            guard !rest.isEmpty else { return outcomes }
            // NotificationsCountDuplicates: a fresh snapshot sees copies committed meanwhile.
            let restRows = JSONValue.array(rest.map { Self.row(index: $0, batch[$0]) }).jsonText
            for try await (index, jti) in try await connection.query(
                """
                WITH input AS (\(Self.inputRows)),
                matched AS (
                    SELECT input.idx, coalesce(
                        (SELECT n.id FROM notifications n WHERE n.jti = input.jti),
                        (SELECT n.id FROM notifications n
                         WHERE n.aud = input.aud AND n.sub = input.sub AND n.type = input.type AND n.event_time = input.event_time)
                    ) AS id
                    FROM input
                ), counted AS (
                    UPDATE notifications n SET deliveries = n.deliveries + c.copies, last_delivery_at = $2
                    FROM (SELECT id, count(*) AS copies FROM matched WHERE id IS NOT NULL GROUP BY id) c
                    WHERE n.id = c.id
                    RETURNING n.id, n.jti
                )
                SELECT matched.idx, counted.jti FROM matched JOIN counted ON counted.id = matched.id
                """.bound(restRows, lastDelivery), logger: logger
            ).decode((Int, String).self) {
                outcomes[index] = .duplicate(jti: jti)
            }
            return outcomes
        }
    }

    /// The batch as one jsonb parameter (`$1`), expanded into typed rows by PostgreSQL: one bind
    /// for any batch size, NULLs included. Times travel as integers (exact) and become timestamptz.
    private static let inputRows = """
        SELECT r.idx, r.jti, r.jti_derived, r.aud, r.sub, r.type, r.raw_type,
            CASE WHEN r.event_time_ms IS NULL THEN NULL ELSE timestamptz 'epoch' + r.event_time_ms * interval '1 millisecond' END AS event_time,
            r.email, r.is_private_email, r.status::notification_status AS status, r.skip_reason, r.skip_detail, r.kid,
            timestamptz 'epoch' + r.issued_at * interval '1 second' AS issued_at,
            CASE WHEN r.expires_at IS NULL THEN NULL ELSE timestamptz 'epoch' + r.expires_at * interval '1 second' END AS expires_at,
            r.raw_jws, r.header, r.claims,
            timestamptz 'epoch' + r.received_at_us * interval '1 microsecond' AS received_at, r.remote_addr
        FROM jsonb_to_recordset($1::jsonb) AS r(
            idx int, jti text, jti_derived boolean, aud text, sub text, type text, raw_type text, event_time_ms bigint,
            email text, is_private_email boolean, status text, skip_reason text, skip_detail text, kid text, issued_at bigint,
            expires_at bigint, raw_jws text, header jsonb, claims jsonb, received_at_us bigint, remote_addr text)
        """

    private static func row(index: Int, _ item: Incoming) -> JSONValue {
        let n = item.notification
        let event = n.decoding.event
        var row: [String: JSONValue] = [
            "idx": .number(Double(index)), "jti": .string(n.jti), "jti_derived": .bool(n.jtiDerived), "aud": .string(n.aud),
            "kid": .string(n.kid), "issued_at": .number(Double(n.issuedAt)), "raw_jws": .string(item.rawJWS),
            "header": JSONValue.parse(Data(n.headerJSON.utf8)) ?? .null, "claims": n.claims,
            "received_at_us": .number((item.receivedAt.timeIntervalSince1970 * 1_000_000).rounded()),
        ]
        if let expiresAt = n.expiresAt { row["expires_at"] = .number(Double(expiresAt)) }
        if let remote = item.remoteAddress { row["remote_addr"] = .string(remote) }
        if let event {
            row["sub"] = .string(event.sub)
            row["type"] = .string(event.type?.rawValue ?? event.rawType)
            row["raw_type"] = .string(event.rawType)
            row["event_time_ms"] = .number(Double(event.eventTimeMillis))
            if let email = event.email { row["email"] = .string(email) }
            if let isPrivate = event.isPrivateEmail { row["is_private_email"] = .bool(isPrivate) }
        }
        switch n.decoding {
        case .event:
            row["status"] = .string(ProcessingStatus.pending.rawValue)
        case .skipped(let reason, let detail, _):
            row["status"] = .string(ProcessingStatus.skipped.rawValue)
            row["skip_reason"] = .string(reason.rawValue)
            row["skip_detail"] = .string(detail)
        }
        return .object(row)
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
        let rows = try await client.query(sql.query, logger: logger)
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

    /// Health: the database answers.
    package func ping() async throws {
        try await client.query("SELECT 1", logger: logger)
    }

    // MARK: JWKSCache

    package func loadKeySetDocument(sourceURL: String) async throws -> (document: String, fetchedAt: Date)? {
        let rows = try await client.query(
            "SELECT document, fetched_at FROM jwks_cache WHERE source_url = \(sourceURL)", logger: logger)
        for try await (document, fetchedAt) in rows.decode((String, Date).self) {
            return (document, fetchedAt)
        }
        return nil
    }

    package func saveKeySetDocument(sourceURL: String, document: String, fetchedAt: Date) async throws {
        try await client.query(
            """
            INSERT INTO jwks_cache (source_url, document, fetched_at) VALUES (\(sourceURL), \(document), \(fetchedAt))
            ON CONFLICT (source_url) DO UPDATE SET document = excluded.document, fetched_at = excluded.fetched_at
            WHERE jwks_cache.fetched_at < excluded.fetched_at
            """, logger: logger)
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
extension String {
    /// This text as a statement whose `$1` is `json` (and `$2` a time), bound, never spliced.
    fileprivate func bound(_ json: String, _ time: Date? = nil) -> PostgresQuery {
        var bindings = PostgresBindings()
        bindings.append(json)
        if let time { bindings.append(time) }
        return PostgresQuery(unsafeSQL: self, binds: bindings)
    }
}

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
