import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import Synchronization

/// Applies effect jobs: a batch (claim, apply, complete: one transaction) and a failed job on its
/// own. The decisions are `EffectBatchPlan` (pure); this executes them: accounts locked and
/// written, sessions revoked, addresses erased. The jobs' own statements are the queue's
/// (`JobQueue.Effects`), which the loops and commands call directly.
package struct EffectStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    /// How long a batch's transaction may sit idle before PostgreSQL ends it, unless told
    /// (`SIWA_JOB_LEASE`; see `runBatch`).
    package static let defaultLease: Duration = .seconds(15)

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

    /// One worker round, in one transaction: claims up to `limit` ready effect jobs (retries due
    /// at `now`, nil: PostgreSQL's), applies their effects, completes them, commits. No lease: a
    /// worker that dies mid-batch loses its connection and the jobs are ready again, no attempt
    /// spent; one that stalls is ended after `lease` idle (`idle_in_transaction_session_timeout`).
    /// A first-seen user's account created meanwhile by another transaction makes the batch run
    /// again (up to `accountRaceTries` times). Throws `BatchFailed` when the effects fail with an
    /// error that may be the jobs' own (`mayBeTheJobs`).
    package func runBatch(
        worker: String, limit: Int, eraseOnDelete: Bool, callbacks: Bool = false, appleTokens: KeptTokensOnAppleEvent = .forget,
        suppressions: SuppressionOptions = .init(), lease: Duration = EffectStore.defaultLease, now: Date? = nil
    ) async throws -> Round {
        try await retryingAccountRace(worker: worker) {
            try await runBatchOnce(
                worker: worker, limit: limit, eraseOnDelete: eraseOnDelete, callbacks: callbacks, appleTokens: appleTokens, suppressions: suppressions,
                lease: lease, now: now)
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

    private func runBatchOnce(
        worker: String, limit: Int, eraseOnDelete: Bool, callbacks: Bool, appleTokens: KeptTokensOnAppleEvent, suppressions: SuppressionOptions,
        lease: Duration, now: Date?
    ) async throws -> Round {
        let logger = self.logger
        let claim = JobQueue.Effects.Claim(limit: limit, lease: lease, now: now)
        let inHand = ClaimedBox()
        do {
            return try await client.bounded.transaction(logger: logger) { connection -> Round in
                var jobs: [ClaimedJob] = []
                for try await job in try await connection.execute(claim, logger: logger) { jobs.append(job) }
                guard !jobs.isEmpty else { return Round() }
                inHand.jobs = jobs
                let applied = try await Self.applyLocked(
                    jobs, worker: worker, eraseOnDelete: eraseOnDelete, callbacks: callbacks, appleTokens: appleTokens, suppressions: suppressions,
                    on: connection, logger: logger)
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
        _ job: ClaimedJob, worker: String, eraseOnDelete: Bool, callbacks: Bool = false, appleTokens: KeptTokensOnAppleEvent = .forget,
        suppressions: SuppressionOptions = .init(), maxAttempts: Int,
        lease: Duration = EffectStore.defaultLease,
        delay: @escaping @Sendable (Int) -> Duration
    ) async throws -> OneOutcome {
        let logger = self.logger
        return try await retryingAccountRace(worker: worker) {
            try await client.bounded.transaction(logger: logger) { connection -> OneOutcome in
                guard let job = try await JobQueue.Effects.claimOne(id: job.id, attempt: job.attempt - 1, lease: lease, on: connection, logger: logger)
                else { return .gone }
                try await connection.query("SAVEPOINT one_job", logger: logger)
                do {
                    let applied = try await Self.applyLocked(
                        [job], worker: worker, eraseOnDelete: eraseOnDelete, callbacks: callbacks, appleTokens: appleTokens, suppressions: suppressions,
                        on: connection, logger: logger)
                    guard let effect = applied.first else { return .gone }
                    return .applied(effect)
                } catch {
                    if Task.isCancelled || !Self.mayBeTheJobs(error) { throw error }
                    let message = loggable(error)
                    try await connection.query("ROLLBACK TO SAVEPOINT one_job", logger: logger)
                    let discarded = job.attempt >= maxAttempts
                    try await JobQueue.Effects.fail(job, error: message, discarded: discarded, delay: delay(job.attempt), worker: worker, on: connection, logger: logger)
                    return .failed(error: message, discarded: discarded)
                }
            }
        }
    }

    /// Applies the effects of `jobs` (locked by this transaction's claim) and completes them:
    /// locks the users' accounts, lets `EffectBatchPlan` decide, executes its plan. Returns what was
    /// applied. With `callbacks`, each applied effect also enqueues its callback (lane `callbacks`)
    /// in the same transaction. A revoking event's user loses their kept Apple tokens (`appleTokens`).
    /// The addresses the events stop or restart are suppressed or lifted (`SuppressionStore.apply`).
    static func applyLocked(
        _ jobs: [ClaimedJob], worker: String, eraseOnDelete: Bool, callbacks: Bool, appleTokens: KeptTokensOnAppleEvent = .forget,
        suppressions: SuppressionOptions = .init(), on connection: PostgresConnection, logger: Logger
    ) async throws -> [AppliedEffect] {
        guard !jobs.isEmpty else { return [] }
        let users = EffectBatchPlan.users(of: jobs.map(\.planned))

        // AccountsLock: the users' current state, locked.
        var states: [AccountKey: AccountState] = [:]
        for try await row in try await connection.execute(LockAccounts(users: users), logger: logger) {
            states[row.user] = row.account
        }
        let existing = Set(states.keys)

        let plan = EffectBatchPlan.plan(jobs.map(\.planned), accounts: states, eraseOnDelete: eraseOnDelete)

        let revoked = try await revoke(plan.revocations, appleTokens: appleTokens, on: connection, logger: logger)

        // Erasure: the address leaves every place we hold it.
        if !plan.erase.isEmpty {
            try await eraseAddresses(of: plan.erase.map { ($0.aud, $0.sub) }, on: connection, logger: logger)
        }

        // JobsComplete + AccountsUpsert + NotificationsApplied + JobAttemptsInsert + CallbacksEnqueue + NOTIFY.
        let applied = plan.applied(revokedSessions: revoked)
        let byID = Dictionary(uniqueKeysWithValues: jobs.map { ($0.id, $0) })
        // Read to the end: a prepared statement's error arrives with its rows, and one left
        // unread here would surface nowhere — COMMIT of the failed transaction answers ROLLBACK.
        let completion = Complete(
            jobs: plan.jobs.compactMap { byID[$0.id] }, applied: applied, worker: worker, callbacks: callbacks,
            accounts: plan.accounts.map { ($0.user, $0.account, existed: existing.contains($0.user)) })
        var (completed, written) = (0, 0)
        for try await row in try await connection.execute(completion, logger: logger) { (completed, written) = (row.0, row.1) }
        guard completed == jobs.count else {
            // Cannot happen while the claim's locks hold; never report effects that were not recorded.
            throw EffectStoreError.completionMismatch(expected: jobs.count, completed: completed)
        }
        guard written == users.count else {
            // Another transaction created a user's account after LockAccounts looked: the plan was
            // decided without it. Roll back; the batch runs again and locks that row.
            throw EffectStoreError.accountCreatedConcurrently(users: users.count - written)
        }
        // Last, so the feed's lock is held only from here to COMMIT.
        try await SuppressionStore.apply(plan.jobs, accounts: states, options: suppressions, on: connection, logger: logger)
        return applied
    }

    /// SessionsRevoke: active sessions in scope, and those attributed to a later revoking event.
    /// The users' kept Apple tokens, kept at or before the event's cutoff (as their sessions), are
    /// forgotten with the sessions' revocation or queued for /auth/revoke. Returns the sessions
    /// revoked per event (`jti`).
    private static func revoke(
        _ revocations: [SessionRevocationOrder], appleTokens: KeptTokensOnAppleEvent, on connection: PostgresConnection, logger: Logger
    ) async throws -> [String: Int] {
        var revoked: [String: Int] = [:]
        guard !revocations.isEmpty else { return revoked }
        for try await (jti, wasActive) in try await connection.execute(
            RevokeSessions(revocations: revocations, forgetAppleTokens: appleTokens == .forget), logger: logger) where wasActive {
            revoked[jti, default: 0] += 1
        }
        if appleTokens == .revoke {
            let users = Set(revocations.map {
                AppleTokenStore.TokenCutoff(aud: $0.user.aud, sub: $0.user.sub, cutoff: $0.cutoff.map { Date(timeIntervalSince1970: Double($0) / 1000) })
            })
            try await AppleTokenStore.enqueueRevocations(of: Array(users), on: connection, logger: logger)
        }
        return revoked
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

    /// Writes the accounts as the rules left them, marks the notifications applied, logs the
    /// attempts, enqueues callbacks, and NOTIFYs `siwa_effects` (one payload per effect).
    struct Complete: PostgresPreparedStatement {
        static let name = "siwa_effects_complete_v3"
        static let sql = """
            WITH done AS (
                \(JobQueue.Effects.completeSQL(input: "unnest($1::int8[], $3::int8[], $4::int8[]) AS c(id, attempt, started_at_us)"))
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
            ), logged AS (
                \(JobQueue.Effects.logAppliedSQL(from: "r", worker: "$21"))
            ), callbacks AS (
                \(JobQueue.Effects.enqueueCallbacksSQL(from: "r"))
            )
            SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM accounts_updated) + (SELECT count(*) FROM accounts_created),
                (SELECT count(pg_notify('siwa_effects', notify)) FROM r),
                \(JobQueue.notifySQL(.callbacks, ifAnyIn: "callbacks"))
            """
        typealias Row = (Int, Int, Int, Int)
        let jobs: [ClaimedJob]
        let applied: [AppliedEffect]
        let worker: String
        let callbacks: Bool
        /// Each user's account as the rules left it, and whether LockAccounts found (and locked) its row.
        let accounts: [(AccountKey, AccountState, existed: Bool)]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 22)
            bindings.append(jobs.map { Int64($0.id) })
            bindings.append(jobs.map { Int64($0.notificationID) })
            bindings.append(jobs.map { Int64($0.attempt) })
            bindings.append(jobs.map { Int64(($0.claimedAt.timeIntervalSince1970 * 1_000_000).rounded()) })
            bindings.append(applied.map {
                JSONValue.object(["effect": .string($0.effect), "revoked_sessions": .number(Double($0.revokedSessions))]).jsonText
            })
            bindings.append(applied.map(\.noticeJSON))
            bindings.append(applied.map(\.aud))
            bindings.append(applied.map(\.sub))
            bindings.append(applied.map(\.eventTimeMillis))
            bindings.append(NullableArray(applied.map { callbacks ? $0.callback.jsonText : nil }))
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

    /// Erases the users' email address from the notifications that may carry it and from kept
    /// rejection tokens, and takes them out of every app transfer. Accounts are the caller's part.
    static func eraseAddresses(of users: [(aud: String, sub: String)], on connection: PostgresConnection, logger: Logger) async throws {
        try await NotificationStore.eraseAddresses(of: users, on: connection, logger: logger)
        try await RejectionStore.eraseKeptTokens(subs: users.map(\.sub), on: connection, logger: logger)
        try await TransferStore.forget(erased: users, on: connection, logger: logger)
    }
}
