import Logging
import PostgresNIO
import SiwaRuntime
import Synchronization

/// Waits for what background work writes to the database, woken by the NOTIFY the work sends
/// (`siwa_effects` at each applied batch, `siwa_jobs` at each enqueue): a notification is a hint
/// to re-read, never counted (PostgreSQL folds equal payloads of one transaction into one).
package enum DatabaseEvents {
    /// Whether `condition` holds within `limit`: checked once LISTEN on `channel` is in effect (so
    /// nothing sent after the check is missed), then again at each notification on it. The limit
    /// covers the connection's lease and the LISTEN too (a pool reconnecting may be slow to lease).
    package static func wait(
        _ client: PostgresClient, on channel: String, within limit: Duration = .seconds(60),
        until condition: @escaping @Sendable () async throws -> Bool
    ) async throws -> Bool {
        do {
            return try await withDeadline(limit) {
                try await client.withConnection { connection in
                    try await connection.listen(on: channel) { notifications in
                        if try await condition() { return true }
                        for try await _ in notifications {
                            if try await condition() { return true }
                        }
                        return try await condition()  // the connection closed
                    }
                }
            }
        } catch is DeadlineExceeded {
            return try await condition()
        }
    }

    /// Waits (up to `limit`) until `query` counts at least `target`, re-counting at each NOTIFY on
    /// `channel`; returns the last count, for the caller's expectation to show.
    @discardableResult
    package static func count(
        _ client: PostgresClient, _ query: String, reaches target: Int, on channel: String = "siwa_effects", within limit: Duration = .seconds(60)
    ) async throws -> Int {
        let last = Counter()
        _ = try await wait(client, on: channel, within: limit) {
            let n = try await TestBinary.count(client, PostgresQuery(unsafeSQL: query))
            last.set(n)
            return n >= target
        }
        return last.value
    }

    /// Whether `query` (a count of sessions waiting for a lock the test holds) reaches `target`
    /// within `limit`. The one sampled wait: PostgreSQL announces no lock wait (no NOTIFY, no
    /// event a client can await), so `pg_locks`/`pg_stat_activity` are read every 20 ms — a
    /// wait on the database's own state, bounded, for tests that hold a lock on purpose.
    package static func waitForLockWaiters(
        _ client: PostgresClient, _ query: String, reach target: Int, within limit: Duration = .seconds(30)
    ) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while true {
            if try await TestBinary.count(client, PostgresQuery(unsafeSQL: query)) >= target { return true }
            guard ContinuousClock.now < deadline else { return false }
            try await Task.sleep(for: .milliseconds(20))  // a sample: PostgreSQL signals no lock wait
        }
    }
}

/// The last value a condition saw.
private final class Counter: Sendable {
    private let state = Mutex(0)
    var value: Int { state.withLock { $0 } }
    func set(_ value: Int) { state.withLock { $0 = value } }
}
