import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import Synchronization

/// An effect job held by a worker, with the event it applies.
package struct ClaimedJob: Sendable {
    package var id: Int
    package var attempt: Int
    package var notificationID: Int
    package var jti: String
    package var aud: String
    package var event: AppleEvent
    package var claimedAt: Date
}

extension ClaimedJob {
    /// A row of a claim: job id, attempt, notification id, jti, aud, sub, type, raw type, event
    /// time (ms), email, is_private_email, claimed at.
    init(claimed row: PostgresRow) throws {
        let r = try row.decode((Int, Int, Int, String, String, String, String, String, Int64, String?, Bool?, Date).self)
        self.init(
            id: r.0, attempt: r.1, notificationID: r.2, jti: r.3, aud: r.4,
            event: AppleEvent(rawType: r.7, type: EventType(apple: r.6), sub: r.5, eventTimeMillis: r.8, email: r.9, isPrivateEmail: r.10),
            claimedAt: r.11)
    }
}

/// What applying one job did (for logs, NOTIFY and callbacks).
package struct AppliedEffect: Sendable, Equatable {
    package var jobID: Int
    package var jti: String
    package var aud: String
    package var sub: String
    package var type: String
    package var eventTimeMillis: Int64
    package var effect: String
    package var revokedSessions: Int
}

/// Every SQL statement of the effect queue: the batch (claim, apply, complete: one transaction),
/// a failed job on its own, and — for the leased delivery lanes, and effect jobs a version before
/// batches-in-one-transaction left `running` — rescue, heartbeat, release; prune, and the
/// operator's views. The rules themselves are `EffectRules` (pure).
package struct EffectStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    /// How long a batch's transaction may sit idle before PostgreSQL ends it, unless told
    /// (`SIWA_JOB_LEASE`; see `runBatch`).
    package static let defaultStall: Duration = .seconds(15)

    // MARK: JobsClaim + EffectsApply: one transaction per batch

    /// What one worker round did: the jobs it claimed and the effects it applied.
    package struct Round: Sendable {
        package var claimed: [ClaimedJob] = []
        package var applied: [AppliedEffect] = []
    }

    /// A batch whose effects could not be applied: its transaction rolled back, so its jobs are
    /// ready again exactly as before the claim (no attempt spent). The worker then tries them one
    /// by one (`runOne`), so one bad job cannot hold back its batch.
    package struct BatchFailed: Error {
        package var jobs: [ClaimedJob]
        package var underlying: any Error
    }

    /// One worker round, in one transaction: claims up to `limit` ready effect jobs (their rows
    /// locked, `SKIP LOCKED`, so no other worker can take them), applies their effects to accounts
    /// and sessions, completes them, commits. No lease, no `running` state, no heartbeat: a worker
    /// that dies mid-batch loses its connection, PostgreSQL rolls the transaction back, and the
    /// jobs are ready at once for the next claim, with no attempt spent. Against a claim committed
    /// on its own (then applied in a second transaction), this is one commit and one update of
    /// each job fewer per batch.
    ///
    /// `stall` bounds a worker that stops without losing its connection (a paused process, a
    /// frozen VM, a half-open TCP connection): PostgreSQL ends a transaction left idle that long
    /// (`idle_in_transaction_session_timeout`, set for this transaction only), which frees its
    /// jobs — the lease's job, without a heartbeat.
    ///
    /// Accounts: a user's row is locked before the rules read it (LockAccounts). A user without a
    /// row has nothing to lock, so another transaction may create it meanwhile — a session, an
    /// erasure, or the user's own earlier event delivered late and claimed beside this one (the
    /// gate reads the claim's snapshot). Writing the rules' result over it would lose what it
    /// holds; instead the batch rolls back and runs again, locking that row (up to `accountRaceTries` times,
    /// then `EffectStoreError.accountCreatedConcurrently` is thrown: its jobs are ready again).
    ///
    /// Throws `BatchFailed` when the effects fail after the claim with an error that may be the
    /// jobs' own (not a lost connection, a deadline, a deadlock or a shutdown: then the batch just
    /// rolled back and its jobs are ready again).
    package func runBatch(
        worker: String, limit: Int, eraseOnDelete: Bool, callbacks: Bool = false, stall: Duration = EffectStore.defaultStall
    ) async throws -> Round {
        try await retryingAccountRace(worker: worker) {
            try await runBatchOnce(worker: worker, limit: limit, eraseOnDelete: eraseOnDelete, callbacks: callbacks, stall: stall)
        }
    }

    /// Runs `transaction` again at once when it lost a race for a first-seen user's account (it
    /// rolled back whole; the next run locks the row the other transaction created). Each user
    /// can cause that once (accounts are never deleted), so a few tries suffice; after them the
    /// error is thrown (not the jobs' fault, see `mayBeTheJobs`).
    private func retryingAccountRace<T>(worker: String, _ transaction: () async throws -> T) async throws -> T {
        for _ in 1..<Self.accountRaceTries {
            do {
                return try await transaction()
            } catch EffectStoreError.accountCreatedConcurrently(let users) {
                logger.info(
                    "effects rolled back: an account was created concurrently; running them again",
                    metadata: ["worker": "\(worker)", "users": "\(users)"])
            }
        }
        return try await transaction()
    }

    static let accountRaceTries = 3

    private func runBatchOnce(worker: String, limit: Int, eraseOnDelete: Bool, callbacks: Bool, stall: Duration) async throws -> Round {
        let logger = self.logger
        let claim = Claim(limit: limit, stall: stall)
        let inHand = ClaimedBox()
        do {
            return try await client.bounded.transaction(logger: logger) { connection -> Round in
                var jobs: [ClaimedJob] = []
                for try await job in try await connection.execute(claim, logger: logger) { jobs.append(job) }
                guard !jobs.isEmpty else { return Round() }
                inHand.jobs = jobs
                let applied = try await Self.applyLocked(jobs, worker: worker, eraseOnDelete: eraseOnDelete, callbacks: callbacks, on: connection, logger: logger)
                return Round(claimed: jobs, applied: applied)
            }
        } catch {
            if let jobs = inHand.jobs, Self.mayBeTheJobs(error) { throw BatchFailed(jobs: jobs, underlying: error) }
            throw error
        }
    }

    /// Whether a failed batch's error may come from its jobs (a statement PostgreSQL refused:
    /// a constraint, a trigger, bad data), rather than from the connection, the server's state or
    /// a transient conflict — SQLSTATE classes 08 (connection), 25 (e.g. idle-in-transaction
    /// timeout), 40 (deadlock, serialization), 53 (resources), 57 (shutdown, cancel), or no
    /// server error at all (a deadline, a closed connection, cancellation). Those say nothing
    /// about a job: retrying the jobs one by one, or spending their attempts, would be wrong.
    static func mayBeTheJobs(_ error: any Error) -> Bool {
        if case .accountCreatedConcurrently = error as? EffectStoreError { return false }
        if error is EffectStoreError { return true }
        guard let state = (error as? PSQLError)?.serverInfo?[.sqlState] else { return false }
        return !["08", "25", "40", "53", "57"].contains(String(state.prefix(2)))
    }

    /// The jobs of a batch, once claimed (a failed transaction's closure result is lost with it).
    private final class ClaimedBox: Sendable {
        private let held = Mutex<[ClaimedJob]?>(nil)
        var jobs: [ClaimedJob]? {
            get { held.withLock { $0 } }
            set { held.withLock { $0 = newValue } }
        }
    }

    /// What became of one job tried on its own.
    package enum OneOutcome: Sendable {
        case applied(AppliedEffect)
        /// Its effect failed: recorded as an attempt, the job `retryable` (after a backoff) or
        /// `discarded` (out of attempts).
        case failed(error: String, discarded: Bool)
        /// Another worker has it, or it is no longer ready (completed meanwhile).
        case gone
    }

    /// Tries one job of a failed batch on its own, in one transaction: locks it again (as it was
    /// when claimed), applies its effect under a savepoint; if that fails, rolls back to the
    /// savepoint and records the failed attempt instead — both under the same lock.
    /// An error that says nothing about the job (see `mayBeTheJobs`) is thrown, not recorded.
    package func runOne(
        _ job: ClaimedJob, worker: String, eraseOnDelete: Bool, callbacks: Bool = false, maxAttempts: Int, stall: Duration = EffectStore.defaultStall,
        delay: @escaping @Sendable (Int) -> Duration
    ) async throws -> OneOutcome {
        let logger = self.logger
        let sql = Self.claimOneSQL(id: job.id, attempt: job.attempt - 1, stall: stall)
        return try await retryingAccountRace(worker: worker) {
            try await client.bounded.transaction(logger: logger) { connection -> OneOutcome in
                guard let job = try await Self.claimLocked(sql, on: connection, logger: logger).first else { return .gone }
                try await connection.query("SAVEPOINT one_job", logger: logger)
                do {
                    let applied = try await Self.applyLocked([job], worker: worker, eraseOnDelete: eraseOnDelete, callbacks: callbacks, on: connection, logger: logger)
                    guard let effect = applied.first else { return .gone }
                    return .applied(effect)
                } catch {
                    if Task.isCancelled || !Self.mayBeTheJobs(error) { throw error }
                    let message = loggable(error)
                    try await connection.query("ROLLBACK TO SAVEPOINT one_job", logger: logger)
                    let discarded = job.attempt >= maxAttempts
                    try await Self.failLocked(job, error: message, discarded: discarded, delay: delay(job.attempt), worker: worker, on: connection, logger: logger)
                    return .failed(error: message, discarded: discarded)
                }
            }
        }
    }

    /// The claim (EffectsHeads + JobsClaim): up to `limit` ready effect jobs, each its user's
    /// earliest unfinished one, locked with `SKIP LOCKED`, with the events they apply. Per-user
    /// order: a job is eligible only when no earlier (event_time, id) job of the same user is
    /// unfinished, so one user never has two effect jobs in flight (a job in another worker's
    /// transaction is locked, not finished: its user's later jobs wait), while many users run in
    /// parallel.
    ///
    /// Retries that are due first, in run order; then available jobs in event order — the gate's
    /// own order, so the first job met of each user is its earliest and nearly every probe passes
    /// (in run order, a backlog whose users' events were enqueued out of order made every claim
    /// probe the same blocked jobs again: sql/010). Each scan tests a job by the per-user gate (one
    /// probe of `jobs_user_order`; why that index is not partial: sql/003) and then locks it; rows
    /// another worker holds are skipped and do not count towards `limit` (the lock sits under the
    /// limit in the plan), so a batch is full whenever enough work is ready, and the scan probes
    /// only as far as it must: the batches other workers hold at the front, then its own. (The
    /// gate reads the statement's snapshot: a job delivered late with an earlier event_time can
    /// run beside its user's later one; the effect rules make the result the same in any order.)
    ///
    /// The query is `siwa_claim_effects` (sql/010): a function, so that each connection plans it
    /// once, under settings that leave only that plan (see there); this prepared statement adds
    /// the transaction's settings (`transactionSettingsSQL`).
    package struct Claim: PostgresPreparedStatement {
        package static let name = "siwa_effects_claim_v1"
        package static let sql = """
            WITH claimed AS MATERIALIZED (
                SELECT * FROM siwa_claim_effects($1::integer)
            )
            \(EffectStore.transactionSettingsSQL(from: "claimed", stall: "$2::text"))
            SELECT c.job_id, c.attempt, c.notification_id, c.jti, c.aud, c.sub, c.type, c.raw_type, c.event_time_ms, c.email,
                c.is_private_email, now()
            FROM claimed c, (SELECT count(*) FROM settings) s
            ORDER BY c.job_id
            """
        package typealias Row = ClaimedJob
        let limit: Int
        let stall: Duration

        package init(limit: Int, stall: Duration = EffectStore.defaultStall) {
            precondition(limit > 0)
            self.limit = limit
            self.stall = stall
        }

        package func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 2)
            bindings.append(limit)
            bindings.append(EffectStore.idleLimit(stall))
            return bindings
        }

        package func decodeRow(_ row: PostgresRow) throws -> ClaimedJob { try ClaimedJob(claimed: row) }
    }

    /// The per-user gate on a job `j`: no earlier (event_time, id) effect job of its user is
    /// unfinished — the same condition as in `siwa_claim_effects` (sql/010); QueueTests checks,
    /// case by case, that the two take and refuse the same jobs.
    private static let gateSQL = """
        NOT EXISTS (
                  SELECT 1 FROM jobs e
                  WHERE e.aud = j.aud AND e.sub = j.sub AND e.lane = 'effects'
                    AND e.state IN ('available', 'retryable', 'running')
                    AND (e.event_time, e.id) < (j.event_time, j.id))
        """

    /// One job of a failed batch again, as it was claimed (same attempt count, still ready, still
    /// its user's earliest unfinished one), locked.
    static func claimOneSQL(id: Int, attempt: Int, stall: Duration) -> String {
        """
        WITH candidates AS (
            SELECT j.id, j.notification_id, j.attempt FROM jobs j
            WHERE j.id = \(id) AND j.attempt = \(attempt) AND j.lane = 'effects' AND j.state IN ('available', 'retryable') AND \(gateSQL)
            FOR UPDATE OF j SKIP LOCKED
        )
        \(claimedColumnsSQL(stall: stall))
        """
    }

    /// The claimed jobs with their events (see `transactionSettingsSQL`).
    private static func claimedColumnsSQL(stall: Duration) -> String {
        """
        \(transactionSettingsSQL(from: "candidates", stall: "'\(idleLimit(stall))'"))
        SELECT c.id, c.attempt + 1, n.id, n.jti, n.aud, n.sub, n.type, n.raw_type,
            (extract(epoch FROM n.event_time) * 1000)::bigint, n.email, n.is_private_email, now()
        FROM candidates c JOIN notifications n ON n.id = c.notification_id, (SELECT count(*) FROM settings) s
        ORDER BY c.id
        """
    }

    /// A CTE `settings` (`, settings AS (…)`, to follow the claim's) that, when the claim `from`
    /// found a job, sets for the rest of this transaction only (no job, no setting: the
    /// transaction ends at once):
    /// - how long it may sit idle (`stall`, see `runBatch`);
    /// - how its statements are planned: by key, through indexes (no sequential scans, no hash or
    ///   merge joins). Every statement after the claim looks up a batch's rows by key, so that is
    ///   always the right plan once the tables hold more than a few pages — but on a fresh install
    ///   the tables start empty and never analyzed, the planner rightly prefers scans of tiny
    ///   tables, and the prepared statements keep that generic plan (hash joins over scans of
    ///   `accounts` and `jobs`) as the tables grow, until autovacuum's first ANALYZE: measured,
    ///   e2e p50 24 ms against 12 at 1,000/s, 17 M rows read in 20 s (BENCHMARKS.md). The
    ///   settings only add a cost to the other plans: a statement with no index to use still runs.
    static func transactionSettingsSQL(from claim: String, stall: String) -> String {
        """
        , settings AS MATERIALIZED (
            SELECT set_config('idle_in_transaction_session_timeout', \(stall), true),
                set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
                set_config('enable_mergejoin', 'off', true)
            FROM \(claim) LIMIT 1
        )
        """
    }

    /// `stall` as an `idle_in_transaction_session_timeout` value.
    static func idleLimit(_ stall: Duration) -> String { "\(max(1, Int(stall.milliseconds)))ms" }

    private static func claimLocked(_ sql: String, on connection: PostgresConnection, logger: Logger) async throws -> [ClaimedJob] {
        var jobs: [ClaimedJob] = []
        for try await row in try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger) {
            jobs.append(try ClaimedJob(claimed: row))
        }
        return jobs
    }

    /// Applies the effects of `jobs` (locked by this transaction's claim) and completes them.
    /// Returns what was applied. With `callbacks`, each applied effect also enqueues its callback
    /// (lane `callbacks`) in the same transaction.
    static func applyLocked(
        _ jobs: [ClaimedJob], worker: String, eraseOnDelete: Bool, callbacks: Bool, on connection: PostgresConnection, logger: Logger
    ) async throws -> [AppliedEffect] {
        guard !jobs.isEmpty else { return [] }
        let held = jobs.sorted { ($0.event.eventTimeMillis, $0.id) < ($1.event.eventTimeMillis, $1.id) }
        var users: [User] = []
        var seen = Set<User>()
        for job in held {
            let user = User(aud: job.aud, sub: job.event.sub)
            if seen.insert(user).inserted { users.append(user) }
        }

        // AccountsLock: the users' current state, locked.
        var states: [User: AccountState] = [:]
        for try await row in try await connection.execute(LockAccounts(users: users), logger: logger) {
            states[row.user] = row.account
        }
        let existing = Set(states.keys)

        // The rules decide, in event_time order per user.
        var revocations: [Revocation] = []
        var erase = Set<User>()
        var plans: [Int: EffectPlan] = [:]
        for job in held {
            let user = User(aud: job.aud, sub: job.event.sub)
            let plan = EffectRules.plan(job.event, on: states[user] ?? .unknown, eraseOnDelete: eraseOnDelete)
            states[user] = plan.account
            plans[job.id] = plan
            if plan.erase { erase.insert(user) }
            switch plan.revoke {
            case .none: break
            case .createdAtOrBefore(let cutoff, let reason):
                revocations.append(Revocation(job: job, cutoff: cutoff, reason: reason))
            case .all(let reason):
                revocations.append(Revocation(job: job, cutoff: nil, reason: reason))
            }
        }

        // SessionsRevoke: active sessions in scope, and those attributed to a later revoking event.
        var revoked: [String: Int] = [:]
        if !revocations.isEmpty {
            for try await (jti, wasActive) in try await connection.execute(RevokeSessions(revocations: revocations), logger: logger) where wasActive {
                revoked[jti, default: 0] += 1
            }
        }

        // Erasure: the address leaves every place we hold it.
        if !erase.isEmpty {
            try await eraseAddresses(of: erase.map { ($0.aud, $0.sub) }, on: connection, logger: logger)
        }

        // JobsComplete + AccountsUpsert + NotificationsApplied + JobAttemptsInsert + CallbacksEnqueue + NOTIFY.
        let applied = held.map { job -> AppliedEffect in
            AppliedEffect(
                jobID: job.id, jti: job.jti, aud: job.aud, sub: job.event.sub, type: job.event.type?.rawValue ?? job.event.rawType,
                eventTimeMillis: job.event.eventTimeMillis, effect: plans[job.id]!.effect, revokedSessions: revoked[job.jti] ?? 0)
        }
        // Read to the end: a prepared statement's error arrives with its rows, and one left
        // unread here would surface nowhere — COMMIT of the failed transaction answers ROLLBACK.
        let completion = Complete(
            jobs: held, applied: applied, worker: worker, callbacks: callbacks,
            accounts: users.map { ($0, states[$0] ?? .unknown, existed: existing.contains($0)) })
        var (completed, written) = (0, 0)
        for try await row in try await connection.execute(completion, logger: logger) { (completed, written) = (row.0, row.1) }
        guard completed == held.count else {
            // Cannot happen while the claim's locks hold; never report effects that were not recorded.
            throw EffectStoreError.completionMismatch(expected: held.count, completed: completed)
        }
        guard written == users.count else {
            // Another transaction created a user's account after LockAccounts looked: the rules
            // decided without it. Roll back; the batch runs again and locks that row.
            throw EffectStoreError.accountCreatedConcurrently(users: users.count - written)
        }
        return applied
    }

    package enum EffectStoreError: Error, CustomStringConvertible {
        case completionMismatch(expected: Int, completed: Int)
        /// Not the jobs' fault: a race with another writer of a first-seen user's account.
        case accountCreatedConcurrently(users: Int)

        package var description: String {
            switch self {
            case .completionMismatch(let expected, let completed):
                "completed \(completed) of \(expected) claimed jobs (a job changed under its lock); the batch was rolled back"
            case .accountCreatedConcurrently(let users):
                "\(users) account(s) were created by another transaction while this batch applied its effects; the batch was rolled back and its jobs are ready again"
            }
        }
    }

    struct User: Hashable { var aud: String; var sub: String }

    struct Revocation {
        var job: ClaimedJob
        var cutoff: Int64?
        var reason: String
    }

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
            var user: User
            var account: AccountState
        }
        let users: [User]

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
            return Row(user: User(aud: r.0, sub: r.1), account: account)
        }
    }

    /// Revokes the sessions each revoking event covers: active ones created at or before its cutoff,
    /// and those attributed to a later revoking event (the earliest revoking event is recorded).
    struct RevokeSessions: PostgresPreparedStatement {
        static let name = "siwa_sessions_revoke_v1"
        static let sql = """
            WITH r AS (
                SELECT r.aud, r.sub, r.reason, r.jti,
                    timestamptz 'epoch' + r.cutoff_ms * interval '1 millisecond' AS cutoff,
                    timestamptz 'epoch' + r.event_ms * interval '1 millisecond' AS event_time
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[])
                    AS r(aud, sub, reason, jti, cutoff_ms, event_ms)
            ), target AS (
                SELECT s.id, s.revoked_at IS NULL AS was_active, r.reason, r.jti, r.event_time
                FROM sessions s JOIN r ON s.aud = r.aud AND s.sub = r.sub
                WHERE (r.cutoff IS NULL OR s.created_at <= r.cutoff)
                  AND (s.revoked_at IS NULL
                       OR (s.revoked_reason IN ('consent-revoked', 'account-delete') AND s.revoked_event_time > r.event_time))
                FOR UPDATE OF s
            )
            UPDATE sessions s SET revoked_at = coalesce(s.revoked_at, now()), revoked_reason = t.reason, revoked_by = t.jti,
                revoked_event_time = t.event_time
            FROM target t WHERE s.id = t.id
            RETURNING t.jti, t.was_active
            """
        typealias Row = (String, Bool)
        let revocations: [Revocation]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 6)
            bindings.append(revocations.map(\.job.aud))
            bindings.append(revocations.map(\.job.event.sub))
            bindings.append(revocations.map(\.reason))
            bindings.append(revocations.map(\.job.jti))
            bindings.append(NullableArray(revocations.map(\.cutoff)))
            bindings.append(revocations.map(\.job.event.eventTimeMillis))
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
    }

    /// Writes the accounts as the rules left them, marks the notifications applied, logs the
    /// attempts, enqueues callbacks, and NOTIFYs `siwa_effects` (one payload per effect).
    struct Complete: PostgresPreparedStatement {
        static let name = "siwa_effects_complete_v3"
        static let sql = """
            WITH done AS (
                UPDATE jobs j SET state = 'completed', attempt = c.attempt,
                    attempted_at = timestamptz 'epoch' + c.started_at_us * interval '1 microsecond', finished_at = now(),
                    locked_by = NULL, lease_expires_at = NULL
                FROM unnest($1::int8[], $3::int8[], $4::int8[]) AS c(id, attempt, started_at_us)
                WHERE j.id = c.id AND j.state IN ('available', 'retryable')
                RETURNING j.id
            ), accounts_in AS (
                SELECT * FROM unnest($11::text[], $12::text[], $13::text[], $14::bool[], $15::text[], $16::int8[], $17::int8[], $18::int8[],
                    $19::int8[], $20::int8[], $22::bool[]) AS a(aud, sub, email, is_private_email, email_forwarding, email_event_time,
                    consent_revoked_at, deleted_at, consent_event_time, address_event_time, existed)
            ), accounts_updated AS (
                -- Rows LockAccounts found, and locked.
                UPDATE accounts t SET email = a.email, is_private_email = a.is_private_email,
                    email_forwarding = a.email_forwarding::email_forwarding,
                    email_event_time = timestamptz 'epoch' + a.email_event_time * interval '1 millisecond',
                    consent_revoked_at = timestamptz 'epoch' + a.consent_revoked_at * interval '1 millisecond',
                    deleted_at = timestamptz 'epoch' + a.deleted_at * interval '1 millisecond',
                    consent_event_time = timestamptz 'epoch' + a.consent_event_time * interval '1 millisecond',
                    address_event_time = timestamptz 'epoch' + a.address_event_time * interval '1 millisecond',
                    updated_at = now()
                FROM accounts_in a WHERE a.existed AND t.aud = a.aud AND t.sub = a.sub
                RETURNING 1
            ), accounts_created AS (
                -- Users LockAccounts found no row for: a row another transaction created since (a
                -- session, an erasure, a job of the same user delivered late) is left alone and not
                -- counted — the rules never saw it, so writing over it would lose what it holds.
                INSERT INTO accounts (aud, sub, email, is_private_email, email_forwarding, email_event_time, consent_revoked_at, deleted_at,
                    consent_event_time, address_event_time)
                SELECT a.aud, a.sub, a.email, a.is_private_email, a.email_forwarding::email_forwarding,
                    timestamptz 'epoch' + a.email_event_time * interval '1 millisecond',
                    timestamptz 'epoch' + a.consent_revoked_at * interval '1 millisecond',
                    timestamptz 'epoch' + a.deleted_at * interval '1 millisecond',
                    timestamptz 'epoch' + a.consent_event_time * interval '1 millisecond',
                    timestamptz 'epoch' + a.address_event_time * interval '1 millisecond'
                FROM accounts_in a WHERE NOT a.existed
                ORDER BY a.aud, a.sub  -- key order, as LockAccounts: two batches creating the same two accounts wait, not deadlock
                ON CONFLICT (aud, sub) DO NOTHING
                RETURNING 1
            ), r AS (
                SELECT * FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int8[],
                    $10::text[]) AS r(job_id, notification_id, attempt, started_at_us, effect, notify, aud, sub, event_ms, callback)
            ), marked AS (
                UPDATE notifications SET status = 'applied' WHERE id IN (SELECT notification_id FROM r)
            ), logged AS (
                INSERT INTO job_attempts (job_id, notification_id, attempt, worker, started_at, outcome, effect)
                SELECT job_id, notification_id, attempt, $21, timestamptz 'epoch' + started_at_us * interval '1 microsecond', 'applied', effect::jsonb
                FROM r
            ), callbacks AS (
                INSERT INTO jobs (notification_id, kind, lane, aud, sub, event_time, payload)
                SELECT notification_id, 'callback', 'callbacks', aud, sub, timestamptz 'epoch' + event_ms * interval '1 millisecond', callback
                FROM r WHERE callback IS NOT NULL
                ON CONFLICT (notification_id, kind) DO NOTHING
                RETURNING id
            )
            SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM accounts_updated) + (SELECT count(*) FROM accounts_created),
                (SELECT count(pg_notify('siwa_effects', notify)) FROM r),
                (SELECT count(pg_notify('siwa_jobs', 'callbacks')) FROM (SELECT 1 FROM callbacks LIMIT 1) c)
            """
        typealias Row = (Int, Int, Int, Int)
        let jobs: [ClaimedJob]
        let applied: [AppliedEffect]
        let worker: String
        let callbacks: Bool
        /// Each user's account as the rules left it, and whether LockAccounts found (and locked) its row.
        let accounts: [(User, AccountState, existed: Bool)]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 22)
            bindings.append(jobs.map { Int64($0.id) })
            bindings.append(jobs.map { Int64($0.notificationID) })
            bindings.append(jobs.map { Int64($0.attempt) })
            bindings.append(jobs.map { Int64(($0.claimedAt.timeIntervalSince1970 * 1_000_000).rounded()) })
            bindings.append(applied.map {
                JSONValue.object(["effect": .string($0.effect), "revoked_sessions": .number(Double($0.revokedSessions))]).jsonText
            })
            bindings.append(applied.map(EffectStore.notifyPayload))
            bindings.append(applied.map(\.aud))
            bindings.append(applied.map(\.sub))
            bindings.append(applied.map(\.eventTimeMillis))
            bindings.append(NullableArray(applied.map { callbacks ? EffectStore.callbackBody($0) : nil }))
            bindings.append(accounts.map(\.0.aud))
            bindings.append(accounts.map(\.0.sub))
            bindings.append(NullableArray(accounts.map(\.1.email)))
            bindings.append(NullableArray(accounts.map(\.1.isPrivateEmail)))
            bindings.append(NullableArray(accounts.map { $0.1.forwarding?.rawValue }))
            bindings.append(NullableArray(accounts.map(\.1.emailEventTime)))
            bindings.append(NullableArray(accounts.map(\.1.consentRevokedAt)))
            bindings.append(NullableArray(accounts.map(\.1.deletedAt)))
            bindings.append(NullableArray(accounts.map(\.1.consentEventTime)))
            bindings.append(NullableArray(accounts.map(\.1.addressEventTime)))
            bindings.append(worker)
            bindings.append(accounts.map(\.existed))
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
    }

    /// Erases the users' email address from the notifications that carry it (the raw token is
    /// redacted: its base64 holds the address; the decoded events are replaced) and from kept
    /// rejection tokens. Accounts are the caller's part.
    static func eraseAddresses(of users: [(aud: String, sub: String)], on connection: PostgresConnection, logger: Logger) async throws {
        let auds = users.map(\.aud), subs = users.map(\.sub)
        try await connection.query(
            """
            WITH notifications_erased AS (
                UPDATE notifications n SET email = NULL, erased_at = now(),
                    raw_jws = split_part(n.raw_jws, '.', 1) || '.erased.',
                    claims = jsonb_set(n.claims, '{events}', to_jsonb('erased'::text))
                WHERE (n.aud, n.sub) IN (SELECT * FROM unnest(\(auds)::text[], \(subs)::text[]))
                  AND n.erased_at IS NULL AND (n.email IS NOT NULL OR n.type IN ('email-disabled', 'email-enabled'))
            )
            UPDATE rejections SET token = NULL, key_jwk = NULL, body_prefix = ''::bytea
            WHERE sub = ANY(\(subs)::text[]) AND (token IS NOT NULL OR length(body_prefix) > 0)
            """, logger: logger)
    }

    /// The body of the callback that tells the backend about an applied effect (no email address).
    package static func callbackBody(_ effect: AppliedEffect) -> String {
        JSONValue.object([
            "type": .string(effect.type), "aud": .string(effect.aud), "sub": .string(effect.sub), "jti": .string(effect.jti),
            "event_time": .string(iso8601(millis: effect.eventTimeMillis)), "effect": .string(effect.effect),
            "revoked_sessions": .number(Double(effect.revokedSessions)),
        ]).jsonText
    }

    /// The `siwa_effects` NOTIFY payload: small, no email.
    static func notifyPayload(_ effect: AppliedEffect) -> String {
        JSONValue.object([
            "type": .string(effect.type), "aud": .string(effect.aud), "sub": .string(effect.sub), "jti": .string(effect.jti),
            "effect": .string(effect.effect), "revoked_sessions": .number(Double(effect.revokedSessions)),
        ]).jsonText
    }

    // MARK: JobsFail

    /// Records a failed attempt at a job this transaction holds: back to `retryable` after
    /// `delay`, or `discarded`; the notification shows `retrying` / `discarded`.
    static func failLocked(
        _ job: ClaimedJob, error: String, discarded: Bool, delay: Duration, worker: String, on connection: PostgresConnection, logger: Logger
    ) async throws {
        let delayMillis = Int(delay.milliseconds)
        // Read to the end (see applyLocked).
        for try await _ in try await connection.query(
            """
            WITH failed AS (
                UPDATE jobs j SET
                    state = CASE WHEN \(discarded) THEN 'discarded'::job_state ELSE 'retryable'::job_state END,
                    attempt = \(job.attempt), attempted_at = \(job.claimedAt),
                    run_at = now() + \(delayMillis) * interval '1 millisecond',
                    finished_at = CASE WHEN \(discarded) THEN now() END,
                    last_error = \(error), locked_by = NULL, lease_expires_at = NULL
                WHERE j.id = \(job.id)
                RETURNING j.id, j.notification_id, j.attempt, j.attempted_at, j.state
            ), marked AS (
                UPDATE notifications n SET status = CASE WHEN f.state = 'discarded' THEN 'discarded'::notification_status
                                                         ELSE 'retrying'::notification_status END
                FROM failed f WHERE n.id = f.notification_id
            )
            INSERT INTO job_attempts (job_id, notification_id, attempt, worker, started_at, outcome, error)
            SELECT id, notification_id, attempt, \(worker), attempted_at,
                CASE WHEN state = 'discarded' THEN 'discarded' ELSE 'retrying' END, \(error)
            FROM failed
            RETURNING id
            """, logger: logger) {}
    }

    // MARK: JobsRescue, JobsHeartbeat, JobsRelease, JobsPrune

    /// Jobs whose lease ran out (their deliverer was killed, not stopped) go back to the queue, or
    /// are discarded once out of attempts; in every lane (effect jobs are leased no more, but an
    /// older release may have left some `running`; only an effect job's notification changes
    /// status). Safe to run from every process at once.
    @discardableResult
    package func rescueExpiredLeases(maxAttempts: Int) async throws -> Int {
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH expired AS (
                SELECT id, locked_by FROM jobs WHERE state = 'running' AND lease_expires_at < now()
                FOR UPDATE SKIP LOCKED
            ), rescued AS (
                UPDATE jobs j SET
                    state = CASE WHEN j.attempt >= \(maxAttempts) THEN 'discarded'::job_state ELSE 'retryable'::job_state END,
                    finished_at = CASE WHEN j.attempt >= \(maxAttempts) THEN now() END,
                    run_at = now(), locked_by = NULL, lease_expires_at = NULL,
                    last_error = 'lease expired: worker ' || e.locked_by || ' stopped renewing it'
                FROM expired e WHERE j.id = e.id
                RETURNING j.id, j.notification_id, j.alert_id, j.attempt, j.attempted_at, j.state, j.lane, e.locked_by
            ), marked AS (
                UPDATE notifications n SET status = CASE WHEN r.state = 'discarded' THEN 'discarded'::notification_status
                                                         ELSE 'retrying'::notification_status END
                FROM rescued r WHERE n.id = r.notification_id AND r.lane = 'effects'
            ), logged AS (
                INSERT INTO job_attempts (job_id, notification_id, alert_id, attempt, worker, started_at, outcome, error, lane)
                SELECT id, notification_id, alert_id, attempt, locked_by, attempted_at, 'lease_expired', 'lease expired', lane FROM rescued
            )
            SELECT count(*)::bigint FROM rescued
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }

    /// Renews the leases of `jobs`, those of them `worker` still holds.
    package func heartbeat(worker: String, jobs: [Int], lease: Duration) async throws {
        let leaseMillis = Int(lease.milliseconds)
        try await client.bounded.query(
            """
            UPDATE jobs SET lease_expires_at = now() + \(leaseMillis) * interval '1 millisecond'
            WHERE id = ANY(\(jobs)::bigint[]) AND state = 'running' AND locked_by = \(worker)
            """, logger: logger)
    }

    /// Graceful shutdown: leased jobs `workers` still hold (deliveries) go back to the queue as if
    /// never attempted, in one statement (shutdown waits on it once, not once per deliverer).
    /// Returns how many each held.
    @discardableResult
    package func release(workers: [String]) async throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for try await (worker, n) in try await client.bounded.query(
            """
            WITH held AS (
                SELECT id, locked_by FROM jobs WHERE state = 'running' AND locked_by = ANY(\(workers)::text[]) FOR UPDATE
            ), released AS (
                UPDATE jobs j SET state = 'available', run_at = now(), attempt = j.attempt - 1, locked_by = NULL, lease_expires_at = NULL
                FROM held WHERE j.id = held.id
                RETURNING held.locked_by
            ) SELECT locked_by, count(*)::bigint FROM released GROUP BY locked_by
            """, logger: logger
        ).decode((String, Int).self) {
            counts[worker] = n
        }
        return counts
    }

    /// Deletes finished jobs older than `retention` (their attempts stay in job_attempts).
    @discardableResult
    package func prune(retention: Duration, limit: Int = 10_000) async throws -> Int {
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH pruned AS (
                DELETE FROM jobs WHERE id IN (
                    SELECT id FROM jobs WHERE state IN ('completed', 'discarded')
                      AND finished_at < now() - \(Int(retention.components.seconds)) * interval '1 second'
                    LIMIT \(limit))
                RETURNING id
            ) SELECT count(*)::bigint FROM pruned
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }

    // MARK: JobsRetry, JobsReplay, JobsList

    /// Puts jobs back in the queue: one by id, or every discarded one (optionally of one event type).
    /// Their notifications show `pending` again.
    @discardableResult
    package func retry(jobID: Int?, discarded: Bool, type: String?) async throws -> Int {
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH retried AS (
                UPDATE jobs j SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL, last_error = NULL,
                    locked_by = NULL, lease_expires_at = NULL
                FROM notifications n
                WHERE n.id = j.notification_id AND j.lane = 'effects' AND j.state <> 'running'
                  AND ((\(jobID)::bigint IS NOT NULL AND j.id = \(jobID)) OR (\(discarded) AND j.state = 'discarded'))
                  AND (\(type)::text IS NULL OR n.type = \(type))
                RETURNING j.notification_id
            ), marked AS (
                UPDATE notifications SET status = 'pending' WHERE id IN (SELECT notification_id FROM retried)
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }

    /// Re-runs a stored notification's effect (idempotent: the rules make a second application a
    /// no-op). Returns false when no such notification has an effect to run.
    package func replay(jti: String) async throws -> Bool {
        var replayed = false
        for try await (_,) in try await client.bounded.query(
            """
            WITH target AS (
                SELECT id, aud, sub, event_time FROM notifications
                WHERE jti = \(jti) AND type IN ('email-disabled', 'email-enabled', 'consent-revoked', 'account-delete')
            ), marked AS (
                UPDATE notifications SET status = 'pending' WHERE id IN (SELECT id FROM target)
            )
            INSERT INTO jobs (notification_id, aud, sub, event_time, run_at)
            SELECT id, aud, sub, event_time, now() FROM target
            ON CONFLICT (notification_id, kind) DO UPDATE SET state = 'available', run_at = now(), attempt = 0, finished_at = NULL,
                last_error = NULL, locked_by = NULL, lease_expires_at = NULL
            WHERE jobs.state <> 'running'
            RETURNING id
            """, logger: logger
        ).decode((Int,).self) {
            replayed = true
        }
        if replayed { try await client.bounded.query("SELECT pg_notify('siwa_jobs', '')", logger: logger) }
        return replayed
    }

    package struct JobSummary: Sendable {
        package var id: Int
        package var state: String
        package var attempt: Int
        package var jti: String
        package var aud: String
        package var sub: String?
        package var type: String?
        package var runAt: Date
        package var createdAt: Date
        package var finishedAt: Date?
        package var lockedBy: String?
        package var lastError: String?
    }

    package func list(state: String?, limit: Int) async throws -> [JobSummary] {
        var sql = SQLBuilder(
            """
            SELECT j.id, j.state::text, j.attempt, n.jti, n.aud, n.sub, n.type, j.run_at, j.created_at, j.finished_at, j.locked_by, j.last_error
            FROM jobs j JOIN notifications n ON n.id = j.notification_id
            """)
        sql.filter("j.lane =", "effects")
        sql.filter("j.state::text =", state)
        sql.append(" ORDER BY j.id DESC LIMIT ")
        sql.bind(max(1, min(limit, 10_000)))
        var result: [JobSummary] = []
        for try await row in try await client.bounded.query(sql.query, logger: logger).decode(
            (Int, String, Int, String, String, String?, String?, Date, Date, Date?, String?, String?).self)
        {
            result.append(
                JobSummary(
                    id: row.0, state: row.1, attempt: row.2, jti: row.3, aud: row.4, sub: row.5, type: row.6, runAt: row.7, createdAt: row.8,
                    finishedAt: row.9, lockedBy: row.10, lastError: row.11))
        }
        return result
    }
}
