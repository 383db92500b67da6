import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// What the effects do for suppressions besides the feed: the rules' settings, and the mail
/// providers each change is queued for (`SIWA_SUPPRESSION_TARGETS`).
package struct SuppressionOptions: Sendable, Equatable {
    package var policy: SuppressionRules.Policy
    package var targets: [SuppressionTarget]

    package init(policy: SuppressionRules.Policy = .init(), targets: [SuppressionTarget] = []) {
        self.policy = policy
        self.targets = targets
    }
}

/// A line of the suppression feed.
package struct SuppressionFeedItem: Sendable, Equatable {
    package var cursor: Int
    package var aud: String
    package var address: String
    package var sub: String
    package var action: SuppressionAction
    package var reason: SuppressionReason
    package var eventTime: Date
    package var recordedAt: Date
}

/// An address as it stands now.
package struct SuppressionEntry: Sendable, Equatable {
    package var aud: String
    package var address: String
    package var sub: String
    package var suppressed: Bool
    package var reason: SuppressionReason
    package var eventTime: Date
}

/// The home of `suppressions` (each app's address as the rules left it) and `suppression_changes`
/// (the feed). Writers hold `feedLock` until they commit, so feed ids are taken in commit order
/// and a reader resuming after an id never skips one committed later. Each change is queued, in
/// the same transaction, on the lane of every configured mail provider.
package struct SuppressionStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    /// The advisory lock every writer of the suppression tables holds until it commits.
    static let feedLock: Int64 = 0x5157_5350_5245_5353

    /// Applies the suppression side of an effect batch (locked by its transaction): the users'
    /// addresses known before the batch (`accounts`: their addresses as LockAccounts read them)
    /// and the rows of the addresses involved, decided by `SuppressionRules.plan`, written.
    static func apply(
        _ jobs: [EffectJob], accounts: [AccountKey: AccountState], options: SuppressionOptions, on connection: PostgresConnection, logger: Logger
    ) async throws {
        let relevant = jobs.filter { job in
            switch job.event.type {
            case .emailDisabled?, .emailEnabled?, .accountDelete?: true
            case .consentRevoked?: options.policy.onConsentRevoked
            case nil: false
            }
        }
        guard !relevant.isEmpty else { return }
        try await lock(on: connection, logger: logger)
        var users = Array(Set(relevant.map(\.user)))
        users.sort { ($0.aud, $0.sub) < ($1.aud, $1.sub) }
        let named = Array(Set(relevant.compactMap { job in job.event.email.map { SuppressionKey(aud: job.aud, address: $0) } })).sorted()
        var known: [AccountKey: [String]] = [:]
        for user in users { if let email = accounts[user]?.email { known[user, default: []].append(email) } }
        let states = try await Self.states(of: users, or: named, on: connection, logger: logger)
        let decided = SuppressionRules.plan(relevant, known: known, states: states, policy: options.policy)
        try await write(decided.states.filter { states[$0.key] != $0.value }, changes: decided.changes, targets: options.targets, on: connection, logger: logger)
    }

    /// The rows of the users' addresses and of the addresses named (locked by `feedLock`, held):
    /// two index lookups (by user, by key); an OR of the two scanned the table, under the lock.
    static func states(
        of users: [AccountKey], or named: [SuppressionKey], on connection: PostgresConnection, logger: Logger
    ) async throws -> [SuppressionKey: SuppressionState] {
        var states: [SuppressionKey: SuppressionState] = [:]
        for try await row in try await connection.query(
            """
            SELECT s.aud, s.address, s.sub, s.suppressed, s.reason, (extract(epoch FROM s.event_time) * 1000)::int8
            FROM unnest(\(users.map(\.aud))::text[], \(users.map(\.sub))::text[]) AS u(aud, sub)
            JOIN suppressions s ON s.aud = u.aud AND s.sub = u.sub
            UNION
            SELECT s.aud, s.address, s.sub, s.suppressed, s.reason, (extract(epoch FROM s.event_time) * 1000)::int8
            FROM unnest(\(named.map(\.aud))::text[], \(named.map(\.address))::text[]) AS n(aud, address)
            JOIN suppressions s ON s.aud = n.aud AND s.address = n.address
            """, logger: logger
        ).decode((String, String, String, Bool, String, Int64).self) {
            states[SuppressionKey(aud: row.0, address: row.1)] = SuppressionState(
                sub: row.2, suppressed: row.3, reason: SuppressionReason(rawValue: row.4) ?? .emailDisabled, eventTime: row.5)
        }
        return states
    }

    static func lock(on connection: PostgresConnection, logger: Logger) async throws {
        for try await _ in try await connection.query("SELECT pg_advisory_xact_lock(\(feedLock))", logger: logger) {}
    }

    /// Writes the addresses' new states, the changes (the feed, in their order) and one job per
    /// change and target, in one statement, under `feedLock`; NOTIFYs each lane given work.
    package static func write(
        _ states: [SuppressionKey: SuppressionState], changes: [SuppressionChange], targets: [SuppressionTarget], on connection: PostgresConnection,
        logger: Logger
    ) async throws {
        guard !states.isEmpty || !changes.isEmpty else { return }
        // Held already by a writer that read first; taken here by any other (reentrant).
        try await lock(on: connection, logger: logger)
        let rows = states.sorted { $0.key < $1.key }
        let lanes = targets.map { Lane.suppressions($0).rawValue }
        for try await _ in try await connection.query(
            """
            WITH upserted AS (
                INSERT INTO suppressions AS s (aud, address, sub, suppressed, reason, event_time)
                SELECT aud, address, sub, suppressed, reason, timestamptz 'epoch' + event_ms * interval '1 millisecond'
                FROM unnest(\(rows.map(\.key.aud))::text[], \(rows.map(\.key.address))::text[], \(rows.map(\.value.sub))::text[],
                    \(rows.map(\.value.suppressed))::bool[], \(rows.map(\.value.reason.rawValue))::text[], \(rows.map(\.value.eventTime))::int8[])
                    AS r(aud, address, sub, suppressed, reason, event_ms)
                ON CONFLICT (aud, address) DO UPDATE SET sub = EXCLUDED.sub, suppressed = EXCLUDED.suppressed, reason = EXCLUDED.reason,
                    event_time = EXCLUDED.event_time, updated_at = now()
                RETURNING 1
            ), changed AS (
                SELECT * FROM unnest(\(changes.map(\.key.aud))::text[], \(changes.map(\.key.address))::text[], \(changes.map(\.sub))::text[],
                    \(changes.map(\.action.rawValue))::text[], \(changes.map(\.reason.rawValue))::text[], \(changes.map(\.eventTime))::int8[])
                    WITH ORDINALITY AS c(aud, address, sub, action, reason, event_ms, n)
            ), fed AS (
                INSERT INTO suppression_changes (aud, address, sub, action, reason, event_time)
                SELECT aud, address, sub, action, reason, timestamptz 'epoch' + event_ms * interval '1 millisecond' FROM changed ORDER BY n
                RETURNING 1
            ), lanes AS (
                SELECT * FROM unnest(\(lanes)::text[]) WITH ORDINALITY AS l(lane, m)
            ), queued AS (
                \(unescaped: JobQueue.enqueueSuppressionsSQL(changes: "changed", lanes: "lanes"))
            )
            SELECT (SELECT count(*) FROM upserted), (SELECT count(*) FROM fed),
                (SELECT count(pg_notify('siwa_jobs', lane)) FROM (SELECT DISTINCT lane FROM queued) q)
            """, logger: logger) {}
    }

    // MARK: SuppressionsErase

    /// An erasure here (a privacy request) suppresses the users' addresses, at `now`: the address
    /// stays only as "do not mail", with the reason `erased`. In the erasing transaction.
    static func suppressErased(
        _ users: [(aud: String, sub: String, email: String?)], now: Date, options: SuppressionOptions, on connection: PostgresConnection, logger: Logger
    ) async throws {
        guard !users.isEmpty else { return }
        try await lock(on: connection, logger: logger)
        var known: [AccountKey: [String]] = [:]
        for user in users { if let email = user.email { known[AccountKey(aud: user.aud, sub: user.sub), default: []].append(email) } }
        let states = try await Self.states(
            of: users.map { AccountKey(aud: $0.aud, sub: $0.sub) }, or: users.compactMap { user in user.email.map { SuppressionKey(aud: user.aud, address: $0) } },
            on: connection, logger: logger)
        for (key, state) in states { known[AccountKey(aud: key.aud, sub: state.sub), default: []].append(key.address) }
        let time = Int64((now.timeIntervalSince1970 * 1000).rounded())
        let events = users.flatMap { user in
            SuppressionRules.events(
                reason: .erased, aud: user.aud, sub: user.sub, email: nil, eventTime: time, known: known[AccountKey(aud: user.aud, sub: user.sub)] ?? [])
        }
        let decided = SuppressionRules.apply(events, to: states)
        try await write(decided.states.filter { states[$0.key] != $0.value }, changes: decided.changes, targets: options.targets, on: connection, logger: logger)
    }
}
