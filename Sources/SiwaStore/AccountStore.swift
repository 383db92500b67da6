import Foundation
import Logging
import PostgresNIO
import SiwaDomain

package struct Session: Sendable, Equatable {
    package var id: String
    package var aud: String
    package var sub: String
    package var createdAt: Date
    package var expiresAt: Date?
    package var revokedAt: Date?
    package var revokedReason: String?
    /// Not revoked and not expired, as of the query.
    package var active: Bool
    /// created_at in µs since 1970 (exact, for keyset cursors).
    package var createdMicros: Int64
}

package struct Account: Sendable {
    package var aud: String
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?
    package var realUserStatus: Int?
    package var emailForwarding: String?
    package var consentRevokedAt: Date?
    /// The `iat` of the latest identity token issued after a consent revocation (consent given again).
    package var consentGivenAt: Date?
    package var deletedAt: Date?
    package var erasedAt: Date?
    package var createdAt: Date
    package var updatedAt: Date
    /// The subs this user had before app transfers re-keyed the account, oldest first.
    package var previousSubs: [String] = []
}

package struct Erasure: Sendable {
    package var erasedAt: Date
    package var revokedSessions: Int
    /// Kept Apple tokens queued for `/auth/revoke` (lane `apple_revocations`).
    package var appleRevocations: Int
}

/// Why the database refused a session (the rules live in the `sessions_allowed` trigger, which a
/// backend inserting sessions itself meets too). `message` is the trigger's, naming the time.
package enum AccountStoreError: Error, Sendable {
    /// Apple deleted this Apple ID (SQLSTATE SE001): no session may be created for it.
    case accountDeleted(message: String)
    /// The user revoked consent and has not signed in since (SE002).
    case consentRevoked(message: String)

    init?(_ error: any Error) {
        guard let error = error as? PSQLError, let message = error.serverInfo?[.message] else { return nil }
        switch error.serverInfo?[.sqlState] {
        case "SE001": self = .accountDeleted(message: message)
        case "SE002": self = .consentRevoked(message: message)
        default: return nil
        }
    }
}

/// Sessions and accounts as the backend API sees them, and privacy erasure: every statement.
package struct AccountStore: Sendable {
    package let client: PostgresClient
    let logger: Logger
    /// An erasure suppresses the user's addresses (the feed, and a job per mail provider).
    let suppressions: SuppressionOptions

    package init(client: PostgresClient, logger: Logger, suppressions: SuppressionOptions = .init()) {
        self.client = client
        self.logger = logger
        self.suppressions = suppressions
    }

    private static let sessionColumns = """
        id::text, aud, sub, created_at, expires_at, revoked_at, revoked_reason,
        (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())), (extract(epoch FROM created_at) * 1000000)::bigint
        """
    private typealias SessionRow = (String, String, String, Date, Date?, Date?, String?, Bool, Int64)

    private static func session(_ row: SessionRow) -> Session {
        Session(id: row.0, aud: row.1, sub: row.2, createdAt: row.3, expiresAt: row.4, revokedAt: row.5, revokedReason: row.6, active: row.7, createdMicros: row.8)
    }

    // MARK: SessionsCreate

    /// Creates a session, in one transaction with the account: the account row is upserted first
    /// (with `identity`, the token's email facts update it: the address only when the token is newer
    /// than the stored address and than any privacy erasure), then the `sessions_allowed` trigger
    /// decides under the account's lock; an effect applied at the same moment either comes first
    /// (and the session is refused: `AccountStoreError`) or waits and then revokes it too.
    /// A sign-in completed by a code exchange also keeps `appleToken` and attributes the exchange's
    /// record (`exchangeCall`) to the user in the same transaction, so a refused session leaves
    /// no token behind and its exchange on record with no user.
    package func createSession(
        aud: String, sub: String, expiresAt: Date?, identity: VerifiedIdentity?, appleToken: KeptAppleToken? = nil,
        exchangeCall: Int? = nil
    ) async throws -> Session {
        let logger = self.logger
        let issuedMillis = identity.map { $0.issuedAt * 1000 }
        do {
            return try await client.bounded.transaction(logger: logger) { connection in
                // During an app transfer's window: the user's account under their old sub moves first.
                if let identity, let transferSub = identity.transferSub {
                    _ = try await TransferStore.rekeyOnSignIn(
                        aud: aud, clientID: identity.clientID, transferSub: transferSub, newSub: sub, on: connection, logger: logger)
                }
                try await connection.query(
                    """
                    INSERT INTO accounts AS a (aud, sub, email, is_private_email, real_user_status, address_event_time)
                    VALUES (\(aud), \(sub), \(identity?.email), \(identity?.isPrivateEmail), \(identity?.realUserStatus),
                        CASE WHEN \(identity?.email)::text IS NOT NULL THEN timestamptz 'epoch' + \(issuedMillis)::bigint * interval '1 millisecond' END)
                    ON CONFLICT (aud, sub) DO UPDATE SET
                        email = CASE WHEN a.deleted_at IS NULL AND excluded.email IS NOT NULL
                                      AND excluded.address_event_time > coalesce(a.address_event_time, '-infinity')
                                      AND excluded.address_event_time > coalesce(a.erased_at, '-infinity')
                                 THEN excluded.email ELSE a.email END,
                        is_private_email = CASE WHEN a.deleted_at IS NULL AND excluded.email IS NOT NULL
                                      AND excluded.address_event_time > coalesce(a.address_event_time, '-infinity')
                                      AND excluded.address_event_time > coalesce(a.erased_at, '-infinity')
                                 THEN excluded.is_private_email ELSE a.is_private_email END,
                        address_event_time = CASE WHEN a.deleted_at IS NULL AND excluded.email IS NOT NULL
                                      AND excluded.address_event_time > coalesce(a.address_event_time, '-infinity')
                                      AND excluded.address_event_time > coalesce(a.erased_at, '-infinity')
                                 THEN excluded.address_event_time ELSE a.address_event_time END,
                        real_user_status = coalesce(excluded.real_user_status, a.real_user_status),
                        updated_at = now()
                    """, logger: logger)
                var session: Session?
                for try await row in try await connection.query(
                    """
                    INSERT INTO sessions (aud, sub, expires_at, identity_issued_at)
                    VALUES (\(aud), \(sub), \(expiresAt), timestamptz 'epoch' + \(issuedMillis)::bigint * interval '1 millisecond')
                    RETURNING \(unescaped: Self.sessionColumns)
                    """, logger: logger
                ).decode(SessionRow.self) {
                    session = Self.session(row)
                }
                guard let session else { preconditionFailure("INSERT … RETURNING returned no row") }
                if let appleToken { try await AppleTokenStore.keep(appleToken, aud: aud, sub: sub, on: connection, logger: logger) }
                if let exchangeCall { try await AppleTokenStore.attribute(call: exchangeCall, aud: aud, sub: sub, on: connection, logger: logger) }
                return session
            }
        } catch {
            throw AccountStoreError(error) ?? error
        }
    }

    // MARK: SessionsGet, SessionsLogout, SessionsList

    package func session(id: UUID) async throws -> Session? {
        for try await row in try await client.bounded.query(
            "SELECT \(unescaped: Self.sessionColumns) FROM sessions WHERE id = \(id)", logger: logger
        ).decode(SessionRow.self) {
            return Self.session(row)
        }
        return nil
    }

    /// Logs a session out. Idempotent: an already revoked session keeps its first revocation.
    package func logout(id: UUID) async throws -> Session? {
        for try await row in try await client.bounded.query(
            """
            UPDATE sessions SET revoked_at = coalesce(revoked_at, now()), revoked_reason = coalesce(revoked_reason, 'logout')
            WHERE id = \(id)
            RETURNING \(unescaped: Self.sessionColumns)
            """, logger: logger
        ).decode(SessionRow.self) {
            return Self.session(row)
        }
        return nil
    }

    /// The user's sessions, newest first, `limit` at a time after `cursor` (created_at µs, id).
    package func sessions(aud: String, sub: String, limit: Int, after cursor: (micros: Int64, id: UUID)?) async throws -> [Session] {
        var sessions: [Session] = []
        for try await row in try await client.bounded.query(
            """
            SELECT \(unescaped: Self.sessionColumns) FROM sessions
            WHERE aud = \(aud) AND sub = \(sub)
              AND (\(cursor?.micros)::bigint IS NULL
                   OR (created_at, id) < (timestamptz 'epoch' + \(cursor?.micros)::bigint * interval '1 microsecond', \(cursor?.id)::uuid))
            ORDER BY created_at DESC, id DESC
            LIMIT \(limit)
            """, logger: logger
        ).decode(SessionRow.self) {
            sessions.append(Self.session(row))
        }
        return sessions
    }

    // MARK: AccountsGet

    /// The account of `sub`, or, when an app transfer re-keyed it, of the sub it has now: a
    /// user's previous subs lead to their account, and are listed with it.
    package func account(aud: String, sub: String) async throws -> Account? {
        for try await row in try await client.bounded.query(
            """
            WITH RECURSIVE forward (sub, depth) AS (
                SELECT \(sub)::text, 0
                UNION ALL
                SELECT c.new_sub, f.depth + 1 FROM account_sub_changes c JOIN forward f ON c.aud = \(aud) AND c.old_sub = f.sub WHERE f.depth < 16
            ), found AS (
                SELECT a.* FROM accounts a JOIN forward f ON a.aud = \(aud) AND a.sub = f.sub ORDER BY f.depth LIMIT 1
            ), backward (sub, depth) AS (
                SELECT sub, 0 FROM found
                UNION ALL
                SELECT c.old_sub, b.depth + 1 FROM account_sub_changes c JOIN backward b ON c.aud = \(aud) AND c.new_sub = b.sub WHERE b.depth < 16
            )
            SELECT aud, sub, email, is_private_email, real_user_status::int, email_forwarding::text, consent_revoked_at, deleted_at, erased_at,
                created_at, updated_at, consent_given_at, ARRAY(SELECT b.sub FROM backward b WHERE b.depth > 0 ORDER BY b.depth DESC)
            FROM found
            """, logger: logger
        ).decode((String, String, String?, Bool?, Int?, String?, Date?, Date?, Date?, Date, Date, Date?, [String]).self) {
            return Account(
                aud: row.0, sub: row.1, email: row.2, isPrivateEmail: row.3, realUserStatus: row.4, emailForwarding: row.5, consentRevokedAt: row.6,
                consentGivenAt: row.11, deletedAt: row.7, erasedAt: row.8, createdAt: row.9, updatedAt: row.10, previousSubs: row.12)
        }
        return nil
    }

    // MARK: AccountsErase

    /// A privacy request, and the backend's "delete my account": the user's address leaves every
    /// place we hold it (as on `account-delete` with erasure on), every active session is revoked
    /// (`erased`), the kept Apple tokens move into revocation jobs, events from before now never
    /// store the address again, and the audit log records who asked. One transaction; erasing a
    /// user we know nothing about records the request all the same.
    package func erase(aud: String, sub: String, actor: String) async throws -> Erasure {
        let (logger, suppressions) = (self.logger, self.suppressions)
        return try await client.bounded.transaction(logger: logger) { connection in
            var email: String?
            for try await (held,) in try await connection.query(
                "SELECT email FROM accounts WHERE aud = \(aud) AND sub = \(sub) FOR UPDATE", logger: logger
            ).decode((String?,).self) {
                email = held
            }
            var erasedAt = Date()
            for try await (at,) in try await connection.query(
                """
                INSERT INTO accounts AS a (aud, sub, erased_at) VALUES (\(aud), \(sub), now())
                ON CONFLICT (aud, sub) DO UPDATE SET email = NULL, is_private_email = NULL, erased_at = now(), updated_at = now()
                RETURNING a.erased_at
                """, logger: logger
            ).decode((Date,).self) {
                erasedAt = at
            }
            let queued = try await AppleTokenStore.enqueueRevocations(of: [.init(aud: aud, sub: sub)], on: connection, logger: logger)
            var revoked = 0
            for try await (n,) in try await connection.query(
                """
                WITH revoked AS (
                    UPDATE sessions SET revoked_at = now(), revoked_reason = 'erased', revoked_by = 'privacy-request'
                    WHERE aud = \(aud) AND sub = \(sub) AND revoked_at IS NULL
                    RETURNING id
                ), audited AS (
                    INSERT INTO audit_log (actor, action, target, details)
                    SELECT \(actor), 'account.erase', \(aud) || '/' || \(sub),
                        jsonb_build_object('revoked_sessions', count(*), 'apple_revocations', \(queued)::bigint) FROM revoked
                )
                SELECT count(*)::bigint FROM revoked
                """, logger: logger
            ).decode((Int,).self) {
                revoked = n
            }
            try await EffectStore.eraseAddresses(of: [(aud, sub)], on: connection, logger: logger)
            // The address stays in one place: the suppression list, as "do not mail".
            try await SuppressionStore.suppressErased([(aud, sub, email)], now: erasedAt, options: suppressions, on: connection, logger: logger)
            return Erasure(erasedAt: erasedAt, revokedSessions: revoked, appleRevocations: queued)
        }
    }
}
