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

    /// Stores a verified notification and enqueues its job, in one statement inside an explicit
    /// transaction, or counts a delivery of the stored one when it is a duplicate. Returns only
    /// after `COMMIT` has answered: with the extended protocol a statement's rows arrive before the
    /// implicit commit at Sync, so they are no proof of durability; COMMIT's completion is (it is
    /// sent after the commit record is flushed, synchronous_commit being on).
    ///
    /// Concurrent copies: `ON CONFLICT DO NOTHING` waits for the copy being inserted and skips;
    /// the duplicate branch may then not see that row in this statement's snapshot, so an empty
    /// result is retried once, when it is visible.
    package func record(_ notification: VerifiedNotification, rawJWS: String, receivedAt: Date, remoteAddress: String?) async throws -> RecordOutcome {
        for _ in 0..<3 {
            if let outcome = try await recordOnce(notification, rawJWS: rawJWS, receivedAt: receivedAt, remoteAddress: remoteAddress) {
                return outcome
            }
        }
        throw StoreError.conflictUnresolved(jti: notification.jti)
    }

    private func recordOnce(_ n: VerifiedNotification, rawJWS: String, receivedAt: Date, remoteAddress: String?) async throws -> RecordOutcome? {
        let event = n.decoding.event
        let status: ProcessingStatus
        let skipReason: String?
        let skipDetail: String?
        switch n.decoding {
        case .event:
            (status, skipReason, skipDetail) = (.pending, nil, nil)
        case .skipped(let reason, let detail, _):
            (status, skipReason, skipDetail) = (.skipped, reason.rawValue, detail)
        }
        let type = event.map { $0.type?.rawValue ?? $0.rawType }
        let issuedAt = Date(timeIntervalSince1970: Double(n.issuedAt))
        let expiresAt = n.expiresAt.map { Date(timeIntervalSince1970: Double($0)) }
        let query: PostgresQuery = """
            WITH ins AS (
                INSERT INTO notifications (
                    jti, jti_derived, aud, sub, type, raw_type, event_time, email, is_private_email,
                    status, skip_reason, skip_detail, kid, issued_at, expires_at, raw_jws, header, claims,
                    received_at, remote_addr, last_delivery_at)
                VALUES (
                    \(n.jti), \(n.jtiDerived), \(n.aud), \(event?.sub), \(type), \(event?.rawType), \(event?.eventTime),
                    \(event?.email), \(event?.isPrivateEmail), \(status.rawValue)::notification_status, \(skipReason),
                    \(skipDetail), \(n.kid), \(issuedAt), \(expiresAt), \(rawJWS), \(n.headerJSON)::jsonb,
                    \(n.claimsJSON)::jsonb, \(receivedAt), \(remoteAddress), \(receivedAt))
                ON CONFLICT DO NOTHING
                RETURNING id, jti, status
            ), job AS (
                INSERT INTO jobs (notification_id, run_at)
                SELECT id, \(receivedAt) FROM ins WHERE status = 'pending'
            ), existing AS (
                SELECT id FROM notifications WHERE jti = \(n.jti)
                UNION ALL
                SELECT id FROM notifications
                WHERE aud = \(n.aud) AND sub = \(event?.sub) AND type = \(type) AND event_time = \(event?.eventTime)
                LIMIT 1
            ), dup AS (
                UPDATE notifications SET deliveries = deliveries + 1, last_delivery_at = \(receivedAt)
                WHERE NOT EXISTS (SELECT 1 FROM ins) AND id = (SELECT id FROM existing)
                RETURNING jti
            )
            SELECT true, jti FROM ins UNION ALL SELECT false, jti FROM dup
            """
        let logger = self.logger
        return try await client.withTransaction(logger: logger) { connection -> RecordOutcome? in
            var outcome: RecordOutcome?
            for try await (inserted, jti) in try await connection.query(query, logger: logger).decode((Bool, String).self) {
                outcome = inserted ? .accepted(jti: jti, status: status) : .duplicate(jti: jti)
            }
            return outcome
        }
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
    package var description: String {
        switch self {
        case .conflictUnresolved(let jti): "could not record or find notification \(jti) after retries"
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

    package mutating func append(_ fragment: String) { text += fragment }

    package mutating func bind(_ value: some PostgresNonThrowingEncodable & Sendable) {
        bindings.append(value)
        text += "$\(bindings.count)"
    }

    package var query: PostgresQuery { PostgresQuery(unsafeSQL: text, binds: bindings) }
}
