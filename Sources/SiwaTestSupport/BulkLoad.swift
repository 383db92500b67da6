import Foundation
import PostgresNIO
import SiwaStore

/// Loads `count` recorded notifications with their effect jobs straight into the database, spread
/// over `users` users (distinct event times, all four types): a backlog for queue tests and the
/// drain benchmark, without paying for HTTP and RS256 on the way in.
package enum BulkLoad {
    package static func notifications(count: Int, users: Int, aud: String, prefix: String = "bulk", client: PostgresClient) async throws {
        try await client.query(
            """
            WITH n AS (
                INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, email, is_private_email, status, kid, issued_at,
                    raw_jws, header, claims, remote_addr)
                SELECT \(prefix) || '-' || i, \(aud), \(prefix) || '-user-' || (i % \(users)), t.type, t.type,
                    timestamptz '2025-01-01' + ((i::bigint * 7919) % 100000000) * interval '1 millisecond',
                    CASE WHEN t.type LIKE 'email-%' THEN \(prefix) || '-user-' || (i % \(users)) || '@privaterelay.appleid.com' END,
                    CASE WHEN t.type LIKE 'email-%' THEN true END,
                    'pending', 'bulk', now(), 'bulk', '{}'::jsonb, '{}'::jsonb, '127.0.0.1'
                FROM generate_series(1, \(count)) AS i,
                    LATERAL (SELECT (ARRAY['email-disabled', 'email-enabled', 'consent-revoked', 'account-delete'])[1 + (i / \(users)) % 4] AS type) t
                RETURNING id, aud, sub, event_time, status
            )
            \(unescaped: JobQueue.Effects.enqueueSQL(from: "n"))
            """)
    }
}
