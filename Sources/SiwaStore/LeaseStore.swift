import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The `leases` table: a named lease held by one process at a time (the alert evaluator's
/// `alerts`, the endpoint check's `endpoint_check`). A row, so no connection is held for it.
package struct LeaseStore: Sendable {
    let client: PostgresClient
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

    // MARK: LeasesRelease

    /// Gives the lease up (graceful shutdown), so another process takes over at once.
    package func release(lease name: String, holder: String) async throws {
        try await client.bounded.query("DELETE FROM leases WHERE name = \(name) AND holder = \(holder)", logger: logger)
    }
}
