import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import Synchronization

/// The batch's statements that lock the users' accounts and revoke their sessions.
extension EffectStore {
    /// The users' accounts, locked (in key order), as the rules read them; users without an
    /// account have no row.
    struct LockAccounts: PostgresPreparedStatement {
        static let name = "siwa_accounts_lock_v1"
        static let sql = """
            SELECT a.aud, a.sub, a.email, a.is_private_email, a.email_forwarding::text,
                (extract(epoch FROM a.email_event_time) * 1000)::bigint,
                (extract(epoch FROM a.consent_revoked_at) * 1000)::bigint,
                (extract(epoch FROM a.deleted_at) * 1000)::bigint,
                (extract(epoch FROM a.consent_event_time) * 1000)::bigint,
                (extract(epoch FROM a.address_event_time) * 1000)::bigint,
                (extract(epoch FROM a.erased_at) * 1000)::bigint
            FROM accounts a JOIN unnest($1::text[], $2::text[]) AS u(aud, sub) ON a.aud = u.aud AND a.sub = u.sub
            ORDER BY a.aud, a.sub
            FOR UPDATE OF a
            """
        struct Row {
            var user: AccountKey
            var account: AccountState
        }
        let users: [AccountKey]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 2)
            bindings.append(users.map(\.aud))
            bindings.append(users.map(\.sub))
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row {
            let r = try row.decode((String, String, String?, Bool?, String?, Int64?, Int64?, Int64?, Int64?, Int64?, Int64?).self)
            let account = AccountState(
                email: r.2, isPrivateEmail: r.3, forwarding: r.4.flatMap(AccountState.Forwarding.init(rawValue:)),
                emailEventTime: r.5, addressEventTime: r.9, consentRevokedAt: r.6, deletedAt: r.7, consentEventTime: r.8, erasedAt: r.10)
            return Row(user: AccountKey(aud: r.0, sub: r.1), account: account)
        }
    }

    /// Revokes the sessions each revoking event covers: active ones created at or before its cutoff,
    /// and those attributed to a later revoking event (the earliest revoking event is recorded).
    /// With `forgetAppleTokens`, the users' kept Apple tokens are deleted in the same statement.
    struct RevokeSessions: PostgresPreparedStatement {
        static let name = "siwa_sessions_revoke_v3"
        static let sql = """
            WITH r AS (
                SELECT r.aud, r.sub, r.reason, r.jti,
                    timestamptz 'epoch' + r.cutoff_ms * interval '1 millisecond' AS cutoff,
                    timestamptz 'epoch' + r.event_ms * interval '1 millisecond' AS event_time
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[])
                    AS r(aud, sub, reason, jti, cutoff_ms, event_ms)
            ), forgotten AS (
                \(AppleTokenStore.forgetSQL(users: "SELECT DISTINCT aud, sub, cutoff FROM r WHERE $7::bool"))
            ), target AS (
                SELECT s.id, s.revoked_at IS NULL AS was_active, r.reason, r.jti, r.event_time
                FROM sessions s JOIN r ON s.aud = r.aud AND s.sub = r.sub
                WHERE (r.cutoff IS NULL OR s.created_at <= r.cutoff)
                  AND (s.revoked_at IS NULL
                       OR (s.revoked_reason IN (\(EventType.revoking.map { "'\($0.rawValue)'" }.joined(separator: ", "))) AND s.revoked_event_time > r.event_time))
                FOR UPDATE OF s
            )
            UPDATE sessions s SET revoked_at = coalesce(s.revoked_at, now()), revoked_reason = t.reason, revoked_by = t.jti,
                revoked_event_time = t.event_time
            FROM target t WHERE s.id = t.id
            RETURNING t.jti, t.was_active
            """
        typealias Row = (String, Bool)
        let revocations: [SessionRevocationOrder]
        let forgetAppleTokens: Bool

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 7)
            bindings.append(revocations.map(\.user.aud))
            bindings.append(revocations.map(\.user.sub))
            bindings.append(revocations.map(\.reason))
            bindings.append(revocations.map(\.jti))
            bindings.append(NullableArray(revocations.map(\.cutoff)))
            bindings.append(revocations.map(\.eventTimeMillis))
            bindings.append(forgetAppleTokens)
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
    }
}
