import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Synchronization
import Testing

@Suite("The effect queue under load", .timeLimit(.minutes(10)))
struct QueueTests {
    /// Runs `EffectWorkers` as a service until every job is finished, then stops it gracefully.
    static func drain(
        client: PostgresClient, total: Int, giveUpAfter: Duration = .seconds(120), configure: (inout EffectWorkers.Configuration) -> Void
    ) async throws -> Duration {
        var configuration = EffectWorkers.Configuration()
        configure(&configuration)
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        let workers = EffectWorkers(configuration: configuration, store: EffectStore(client: client, logger: logger), logger: logger)
        let group = ServiceGroup(configuration: .init(services: [workers], logger: logger))
        let started = ContinuousClock.now
        let task = Task { try await group.run() }
        // Each applied batch NOTIFYs siwa_effects in its commit: re-counted then, not on a timer.
        let done = try await DatabaseEvents.count(
            client, "SELECT count(*) FROM jobs WHERE state = 'completed'", reaches: total, on: "siwa_effects", within: giveUpAfter)
        #expect(done >= total, "\(done) of \(total) jobs completed within \(giveUpAfter)")
        let elapsed = ContinuousClock.now - started
        await group.triggerGracefulShutdown()
        _ = await task.result
        return elapsed
    }

    static func withDatabase(_ body: (PostgresClient) async throws -> Void) async throws {
        let client = PostgresClient(configuration: try await TestCluster.shared.makeDatabase())
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }  // also when the body throws
            try await body(client)
        }
    }

    static func count(_ client: PostgresClient, _ sql: String) async throws -> Int {
        for try await (n,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((Int,).self) { return n }
        return 0
    }

    /// A database whose tables PostgreSQL never analyzes (autovacuum off for them), with a client
    /// of one connection — one backend: its cached plans, its statistics — and another client.
    static func withNeverAnalyzedDatabase(_ body: (_ one: PostgresClient, _ other: PostgresClient) async throws -> Void) async throws {
        var configuration = try await TestCluster.shared.makeDatabase()
        let other = PostgresClient(configuration: configuration)
        configuration.options.maximumConnections = 1
        let one = PostgresClient(configuration: configuration)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await one.run() }
            group.addTask { await other.run() }
            for table in ["accounts", "jobs", "notifications", "sessions"] {
                try await other.query(PostgresQuery(unsafeSQL: "ALTER TABLE \(table) SET (autovacuum_enabled = off)"))
            }
            defer { group.cancelAll() }  // also when the body throws: the clients' run() would hold the group open
            try await body(one, other)
        }
    }

    /// Rows of accounts, jobs, notifications and sessions read so far by sequential scans and
    /// through indexes, as counted by `client`'s (one) backend and the others.
    static func rowsRead(_ client: PostgresClient) async throws -> (sequential: Int, index: Int) {
        try await client.query("SELECT pg_stat_force_next_flush()")  // flushed when this statement ends
        for try await row in try await client.query(
            """
            SELECT sum(seq_tup_read)::bigint, sum(coalesce(idx_tup_fetch, 0))::bigint FROM pg_stat_user_tables
            WHERE relname IN ('accounts', 'jobs', 'notifications', 'sessions')
            """).decode((Int, Int).self)
        { return (row.0, row.1) }
        return (0, 0)
    }

    @Test("the claim takes a full batch past the rows other workers hold (they do not count towards its limit), probing the per-user gate by user on a backlog PostgreSQL has never analyzed, after planning on the empty queue")
    func claimSkipsHeldRowsAndProbesByUser() async throws {
        try await Self.withNeverAnalyzedDatabase { one, other in
            let logger = Logger(label: "queue-test")
            let store = EffectStore(client: one, logger: logger)
            for _ in 0..<8 {  // an idle queue: the claim is planned (and its plan cached) on empty tables
                #expect(try await store.runBatch(worker: "w", limit: 200, eraseOnDelete: true).claimed.isEmpty)
            }
            // Through `one`, whose statistics `rowsRead` flushes (see claimGoesInEventOrder).
            try await BulkLoad.notifications(count: 20_000, users: 20_000, aud: "com.example.app", client: one)
            // Another worker holds the first 200 jobs in the claim's order (event order).
            try await other.withConnection { holder in
                try await holder.query("BEGIN", logger: logger)
                var held = Set<Int>()
                for try await (id,) in try await holder.query("SELECT id FROM jobs ORDER BY event_time, id LIMIT 200 FOR UPDATE", logger: logger).decode((Int,).self) {
                    held.insert(id)
                }
                let before = try await Self.rowsRead(one)
                let round = try await store.runBatch(worker: "w", limit: 200, eraseOnDelete: true)
                let read = try await Self.rowsRead(one)
                #expect(round.claimed.count == 200)
                #expect(held.isDisjoint(with: round.claimed.map(\.id)))
                // The 400 jobs it stepped over or took, the gate's probe of each one's user, the
                // batch's effects: a few thousand rows — not the 20,000 open jobs per candidate.
                #expect(read.sequential == before.sequential, "\(read.sequential - before.sequential) rows read by sequential scans")
                #expect(read.index - before.index < 5_000, "\(read.index - before.index) rows read through indexes")
                try await holder.query("ROLLBACK", logger: logger)
            }
        }
    }

    @Test("a backlog whose users' events were enqueued newest first: the claim finds each user's earliest without probing the rest of the queue (in run order it probed 18,000 jobs for a batch)")
    func claimGoesInEventOrder() async throws {
        try await Self.withNeverAnalyzedDatabase { one, other in
            let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
            // 2,000 users × 10 events, enqueued round by round (every user's k-th event, then the
            // (k+1)-th), each round an hour earlier than the one before: every user's earliest event
            // is in the last round, behind 18,000 jobs in run order.
            // Through `one`, whose statistics `rowsRead` flushes: another connection's reads
            // (the foreign-key checks of 20,000 inserts) could reach the counters mid-measurement.
            try await one.query(
                """
                WITH n AS (
                    INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, status, kid, issued_at, raw_jws, header, claims)
                    SELECT 'late-' || k || '-' || u, 'com.example.app', 'user-' || u, 'consent-revoked', 'consent-revoked',
                        timestamptz '2025-01-01' - k * interval '1 hour' + u * interval '1 millisecond', 'pending', 'test', now(), 'test',
                        '{}'::jsonb, '{}'::jsonb
                    FROM generate_series(0, 9) AS k, generate_series(1, 2000) AS u
                    ORDER BY k, u
                    RETURNING id, aud, sub, event_time, status)
                \(unescaped: JobQueue.Effects.enqueueSQL(from: "n", order: "id"))
                """, logger: logger)
            let store = EffectStore(client: one, logger: logger)
            let before = try await Self.rowsRead(one)
            let round = try await store.runBatch(worker: "w", limit: 200, eraseOnDelete: true)
            let read = try await Self.rowsRead(one).index - before.index
            #expect(round.claimed.count == 200)
            #expect(round.claimed.allSatisfy { $0.jti.hasPrefix("late-9-") }, "each user's earliest event is its last enqueued")
            #expect(read < 5_000, "\(read) rows read through indexes for a batch of 200")
        }
    }

    @Test("the claim takes due retries first, and each user's earliest unfinished job whatever its state: a due retry before its user's later job, an earlier job before its user's due retry, nothing behind a retry still backing off")
    func claimTakesDueRetriesFirst() async throws {
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        try await Self.withDatabase { client in
            // Available jobs with the earliest event times of all, so that in event order they come
            // before every retry: only "retries first" puts the retries at the head of a batch of one.
            try await Self.insertJob(client, jti: "first-available", sub: "user-0", seconds: 0, logger: logger)
            try await Self.insertJob(client, jti: "due-retry", sub: "user-1", seconds: 600, state: "retryable", logger: logger)
            try await Self.insertJob(client, jti: "after-due-retry", sub: "user-1", seconds: 1200, logger: logger)
            try await Self.insertJob(client, jti: "before-retry", sub: "user-2", seconds: 300, logger: logger)
            try await Self.insertJob(client, jti: "retry-after-earlier", sub: "user-2", seconds: 1800, state: "retryable", logger: logger)
            try await Self.insertJob(client, jti: "backing-off", sub: "user-3", seconds: 60, state: "retryable", runInSeconds: 3_600, logger: logger)
            try await Self.insertJob(client, jti: "after-backing-off", sub: "user-3", seconds: 2400, logger: logger)

            #expect(Set(try await Self.claimable(client, logger: logger).map(\.jti)) == ["first-available", "due-retry", "before-retry"])
            let first = try await Self.claimable(client, limit: 1, logger: logger)
            #expect(first.map(\.jti) == ["due-retry"])
            #expect(first.first?.attempt == 2, "a retry's next attempt")
        }
    }

    @Test("on a fresh install the effect statements stay index lookups as the tables grow: plans PostgreSQL cached while the tables were empty and never analyzed do not scan accounts or jobs")
    func coldStartPlansStayIndexed() async throws {
        try await Self.withNeverAnalyzedDatabase { one, other in
            let store = EffectStore(client: one, logger: Logger(label: "queue-test"))
            // Small batches on near-empty tables: after five custom plans PostgreSQL settles on a
            // generic plan for each prepared statement, costed for tables of a few rows.
            for round in 0..<8 {
                try await BulkLoad.notifications(count: 4, users: 4, aud: "com.example.app", prefix: "small\(round)", client: other)
                #expect(try await store.runBatch(worker: "w", limit: 200, eraseOnDelete: true).applied.count == 4)
            }
            // The tables grow (a launch, a backfill), still never analyzed.
            try await other.query("INSERT INTO accounts (aud, sub) SELECT 'com.example.app', 'seed-' || i FROM generate_series(1, 20000) i")
            try await BulkLoad.notifications(count: 20_000, users: 20_000, aud: "com.example.app", prefix: "big", client: other)
            #expect(try await Self.count(other, "SELECT reltuples::bigint FROM pg_class WHERE relname = 'accounts'") <= 0)

            let before = try await Self.rowsRead(one)
            for _ in 0..<3 {
                #expect(try await store.runBatch(worker: "w", limit: 200, eraseOnDelete: true).applied.count == 200)
            }
            let read = try await Self.rowsRead(one).sequential - before.sequential
            #expect(read == 0, "\(read) rows read by sequential scans of accounts, jobs, notifications and sessions in 3 batches")
        }
    }

    @Test("the jobs a batch held back (each user's next, behind the per-user gate) run as soon as it commits, not at the next poll")
    func heldBackJobsRunWithoutPolling() async throws {
        try await Self.withDatabase { client in
            // 20 events for each of 50 users: a claim takes one job per user (the per-user gate),
            // so every batch is partial, and each frees the next job of each of its users.
            try await BulkLoad.notifications(count: 1_000, users: 50, aud: "com.example.app", client: client)
            _ = try await Self.drain(client: client, total: 1_000, giveUpAfter: .seconds(60)) {
                $0.effects.workers = 1
                $0.queue.listen = false
                $0.effects.batchSize = 200
                $0.queue.pollInterval = .seconds(3600)  // a worker left waiting for its poll would never finish
            }
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed'") == 1_000)
            #expect(try await Self.count(client, "SELECT max(attempt) FROM jobs") == 1)
        }
    }

    /// One notification (consent-revoked unless `type` says) and its job, as the queue tests need them: event time
    /// `seconds` after 2025-01-01, in `lane` and `state` (a retryable job has had one attempt;
    /// finished, running and callback jobs get the columns their state requires), due in
    /// `runInSeconds`.
    static func insertJob(
        _ client: PostgresClient, jti: String, aud: String = "com.example.app", sub: String, type: String = "consent-revoked", seconds: Int,
        lane: String = "effects", state: String = "available", runInSeconds: Int = 0, logger: Logger
    ) async throws {
        try await client.query(
            """
            WITH n AS (
                INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, status, kid, issued_at, raw_jws, header, claims)
                VALUES (\(jti), \(aud), \(sub), \(type), \(type), timestamptz '2025-01-01' + \(seconds) * interval '1 second',
                    'pending', 'test', now(), 'test', '{}'::jsonb, '{}'::jsonb)
                RETURNING id, aud, sub, event_time)
            INSERT INTO jobs (notification_id, aud, sub, event_time, run_at, lane, kind, payload, state, attempt, finished_at, locked_by,
                lease_expires_at)
            SELECT id, aud, sub, event_time, now() + \(runInSeconds) * interval '1 second', \(lane),
                CASE WHEN \(lane) = 'callbacks' THEN 'callback' ELSE 'apply_effect' END,
                CASE WHEN \(lane) = 'callbacks' THEN '{}' END, \(state)::job_state,
                CASE WHEN \(state) = 'retryable' THEN 1 ELSE 0 END,
                CASE WHEN \(state) IN ('completed', 'discarded') THEN now() END,
                CASE WHEN \(state) = 'running' THEN 'an-older-worker' END,
                CASE WHEN \(state) = 'running' THEN now() + interval '1 hour' END
            FROM n
            """, logger: logger)
    }

    /// What the claim would take now (in a transaction rolled back, so nothing changes).
    static func claimable(_ client: PostgresClient, limit: Int = 200, logger: Logger) async throws -> [ClaimedJob] {
        try await client.withConnection { connection in
            try await connection.query("BEGIN", logger: logger)
            var jobs: [ClaimedJob] = []
            for try await job in try await connection.execute(JobQueue.Effects.Claim(limit: limit), logger: logger) { jobs.append(job) }
            try await connection.query("ROLLBACK", logger: logger)
            return jobs
        }
    }

    @Test("a job waits only behind its own user's earlier unfinished effect job, in a batch claim and when retried on its own, case by case")
    func perUserGate() async throws {
        struct Case {
            var name: String
            var aud = "com.example.app"
            var otherSub = false
            var lane = "effects"
            var state = "available"
            var offsetSeconds = -60
            var blocks: Bool
        }
        let cases = [
            Case(name: "the user's earlier available job", blocks: true),
            Case(name: "the user's earlier retryable job", state: "retryable", blocks: true),
            Case(name: "the user's earlier job an older release left running", state: "running", blocks: true),
            Case(name: "the user's earlier completed job", state: "completed", blocks: false),
            Case(name: "the user's earlier discarded job", state: "discarded", blocks: false),
            Case(name: "the user's later available job", offsetSeconds: 60, blocks: false),
            Case(name: "another user's earlier job", otherSub: true, blocks: false),
            Case(name: "the same sub's earlier job under another app", aud: "com.example.other", blocks: false),
            Case(name: "the user's earlier callback delivery", lane: "callbacks", blocks: false),
        ]
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        try await Self.withDatabase { client in
            // Each case's target: its user's only job so far, claimed once (rolled back) as a batch would have.
            for (index, _) in cases.enumerated() {
                try await Self.insertJob(client, jti: "target-\(index)", sub: "user-\(index)", seconds: index * 1_000, logger: logger)
            }
            let claimed = try await Self.claimable(client, logger: logger)
            var targets: [String: ClaimedJob] = [:]
            for job in claimed { targets[job.event.sub] = job }
            #expect(targets.count == cases.count)
            for (index, test) in cases.enumerated() {
                try await Self.insertJob(
                    client, jti: "other-\(index)", aud: test.aud, sub: test.otherSub ? "user-\(index)-other" : "user-\(index)",
                    seconds: index * 1_000 + test.offsetSeconds, lane: test.lane, state: test.state, logger: logger)
            }
            let claimableNow = Set(try await Self.claimable(client, logger: logger).filter { $0.jti.hasPrefix("target-") }.map(\.event.sub))
            let store = EffectStore(client: client, logger: logger)
            for (index, test) in cases.enumerated() {
                let target = try #require(targets["user-\(index)"])
                let outcome = try await store.runOne(target, worker: "test", eraseOnDelete: false, maxAttempts: 5) { _ in .seconds(1) }
                var applied = false
                if case .applied = outcome { applied = true }
                #expect(claimableNow.contains("user-\(index)") == !test.blocks, "the claim, \(test.name)")
                #expect(applied == !test.blocks, "runOne, \(test.name): \(outcome)")
            }
        }
    }

    /// Waits (up to 30 s) until `count` effect transactions of this database wait for a lock at
    /// their completion statement; other tests' databases share the cluster and are not counted.
    static func waitForBlockedCompletions(_ client: PostgresClient, _ count: Int) async throws {
        let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'WITH done AS%'"
        let reached = try await DatabaseEvents.waitForLockWaiters(client, waiting, reach: count)
        let blocked = try await Self.count(client, waiting)
        #expect(reached && blocked == count, "\(blocked), not \(count), transactions blocked at their completion statement within 30 s")
    }

    /// The race tests' user: forwarding, its event time and the consent revocation time, in
    /// seconds after 2025-01-01 (nil: no account).
    static func newUserAccount(_ client: PostgresClient) async throws -> (forwarding: String?, emailEvent: Int?, consentRevoked: Int?)? {
        for try await row in try await client.query(
            """
            SELECT email_forwarding::text, extract(epoch FROM email_event_time - timestamptz '2025-01-01')::int,
                extract(epoch FROM consent_revoked_at - timestamptz '2025-01-01')::int
            FROM accounts WHERE sub = 'new-user'
            """
        ).decode((String?, Int?, Int?).self) { return row }
        return nil
    }

    @Test("a first-seen user's earlier event delivered late runs beside its later one: neither effect is lost (the batch that meets the other's new account row runs again)")
    func firstSeenUserRaceLosesNothing() async throws {
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        try await Self.withDatabase { client in
            let store = EffectStore(client: client, logger: logger)
            func waitUntil(_ count: Int) async throws { try await Self.waitForBlockedCompletions(client, count) }
            try await Self.insertJob(client, jti: "later", sub: "new-user", seconds: 1_200, logger: logger)
            // Both batches stop at their completion statement (it writes job_attempts) until the
            // blocker lets go: each has already read the user's account (none yet) by then.
            try await client.withConnection { blocker in
                try await blocker.query("BEGIN", logger: logger)
                try await blocker.query("LOCK TABLE job_attempts IN EXCLUSIVE MODE", logger: logger)
                async let first = store.runBatch(worker: "a", limit: 10, eraseOnDelete: true)
                try await waitUntil(1)
                // Delivered late: earlier than the job in flight, so the gate lets it run beside it.
                try await Self.insertJob(client, jti: "earlier", sub: "new-user", type: "email-disabled", seconds: 600, logger: logger)
                async let second = store.runBatch(worker: "b", limit: 10, eraseOnDelete: true)
                try await waitUntil(2)
                try await blocker.query("ROLLBACK", logger: logger)
                let rounds = try await [first, second]
                #expect(rounds.map { $0.applied.map(\.jti) }.sorted { $0.description < $1.description } == [["earlier"], ["later"]])
            }
            // Both effects hold: the later consent revocation and the earlier forwarding change.
            let account = try await Self.newUserAccount(client)
            #expect(account?.forwarding == "disabled" && account?.emailEvent == 600, "the email-disabled effect")
            #expect(account?.consentRevoked == 1_200, "the consent-revoked effect")
            #expect(try await Self.count(client, "SELECT count(*) FROM accounts") == 1)
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed' AND attempt = 1") == 2)
            #expect(try await Self.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 2)
        }
    }

    @Test("a job retried on its own (runOne) whose first-seen user's account is created meanwhile runs again and keeps what that account holds")
    func runOneRunsAgainAfterAccountRace() async throws {
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        try await Self.withDatabase { client in
            let store = EffectStore(client: client, logger: logger)
            try await Self.insertJob(client, jti: "revoked", sub: "new-user", seconds: 1_200, logger: logger)
            let job = try #require(try await Self.claimable(client, logger: logger).first)
            // runOne reads the user's account (none yet), then waits at its completion statement
            // while another transaction creates that account.
            try await client.withConnection { blocker in
                try await blocker.query("BEGIN", logger: logger)
                try await blocker.query("LOCK TABLE job_attempts IN EXCLUSIVE MODE", logger: logger)
                async let outcome = store.runOne(job, worker: "one", eraseOnDelete: false, maxAttempts: 5) { _ in .seconds(1) }
                try await Self.waitForBlockedCompletions(client, 1)
                try await client.query(
                    """
                    INSERT INTO accounts (aud, sub, email_forwarding, email_event_time)
                    VALUES ('com.example.app', 'new-user', 'disabled', timestamptz '2025-01-01' + interval '600 seconds')
                    """, logger: logger)
                try await blocker.query("ROLLBACK", logger: logger)
                let result = try await outcome
                guard case .applied(let effect) = result else {
                    Issue.record("runOne: \(result)")
                    return
                }
                #expect(effect.jti == "revoked")
            }
            let account = try await Self.newUserAccount(client)
            #expect(account?.forwarding == "disabled" && account?.emailEvent == 600, "the account's state from the other transaction")
            #expect(account?.consentRevoked == 1_200, "the consent-revoked effect")
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed' AND attempt = 1") == 1)
            #expect(try await Self.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 1)
        }
    }

    @Test("two workers retrying the same job on its own (runOne) at once, then a third after them: it is applied once, the others find it gone")
    func runOneTwiceAtOnce() async throws {
        let logger = Logger(label: "queue-test", factory: { _ in SwiftLogNoOpLogHandler() })
        try await Self.withDatabase { client in
            try await BulkLoad.notifications(count: 20, users: 20, aud: "com.example.app", client: client)
            let jobs = try await Self.claimable(client, logger: logger)
            #expect(jobs.count == 20)
            let store = EffectStore(client: client, logger: logger)
            for job in jobs {
                async let first = store.runOne(job, worker: "one", eraseOnDelete: false, maxAttempts: 5) { _ in .seconds(1) }
                async let second = store.runOne(job, worker: "two", eraseOnDelete: false, maxAttempts: 5) { _ in .seconds(1) }
                let outcomes = try await [first, second]
                let applied = outcomes.filter { if case .applied = $0 { true } else { false } }.count
                let gone = outcomes.filter { if case .gone = $0 { true } else { false } }.count
                #expect(applied == 1 && gone == 1, "job \(job.id): \(outcomes)")
                // A third, late: the job is completed, its claim stale.
                let late = try await store.runOne(job, worker: "three", eraseOnDelete: false, maxAttempts: 5) { _ in .seconds(1) }
                if case .gone = late {} else { Issue.record("job \(job.id) retried after it completed: \(late)") }
            }
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed' AND attempt = 1") == 20)
            #expect(try await Self.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 20)
        }
    }

    @Test("4 workers × 10,000 jobs over 1,000 users: each applied exactly once, each user's in event_time order", arguments: [true, false])
    func exactlyOnceInOrder(notify: Bool) async throws {
        try await Self.withDatabase { client in
            try await BulkLoad.notifications(count: 10_000, users: 1_000, aud: "com.example.app", client: client)
            _ = try await Self.drain(client: client, total: 10_000) {
                $0.effects.workers = 4
                $0.queue.listen = notify
                $0.effects.batchSize = 100
            }
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE state = 'completed'") == 10_000)
            #expect(try await Self.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 10_000)
            #expect(try await Self.count(client, "SELECT count(DISTINCT job_id) FROM job_attempts") == 10_000)
            #expect(try await Self.count(client, "SELECT count(*) FROM notifications WHERE status = 'applied'") == 10_000)
            // Per user, the order of application (attempt ids) follows event_time.
            #expect(try await Self.count(client,
                """
                SELECT count(*) FROM (
                    SELECT n.sub, n.event_time, lag(n.event_time) OVER (PARTITION BY n.sub ORDER BY a.id) AS previous
                    FROM job_attempts a JOIN notifications n ON n.id = a.notification_id
                ) o WHERE previous > event_time
                """) == 0)
            // Every user ended deleted (each has an account-delete among its events) and erased.
            #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE deleted_at IS NOT NULL AND email IS NULL") == 1_000)
        }
    }
}
