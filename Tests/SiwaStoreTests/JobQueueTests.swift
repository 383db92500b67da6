import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import Testing

/// The queue's time rules (leases, rescue, retries, pruning) driven by the time passed in: no
/// waiting, no rows edited behind the queue's back.
@Suite("The job queue's time rules", .timeLimit(.minutes(10)))
struct JobQueueTests {
    static let logger = Logger(label: "job-queue-test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// A database with `count` recorded notifications whose effects were applied, each with a
    /// callback delivery enqueued (as a worker with callbacks on leaves them).
    static func withAppliedEffects(_ count: Int, _ body: (PostgresClient, JobQueue) async throws -> Void) async throws {
        try await QueueTests.withDatabase { client in
            try await BulkLoad.notifications(count: count, users: count, aud: "com.example.app", client: client)
            let round = try await EffectStore(client: client, logger: logger).runBatch(worker: "w", limit: count, eraseOnDelete: true, callbacks: true)
            #expect(round.applied.count == count)
            try await body(client, JobQueue(client: client, logger: logger))
        }
    }

    static func depth(_ queue: JobQueue, _ lane: Lane, _ state: JobState) async throws -> Int {
        try await queue.depth().first { $0.lane == lane && $0.state == state }?.count ?? 0
    }

    /// A lane is a declaration: the schema names none (a new lane rewrites no constraint), and
    /// each lane `serve` runs has partial indexes of its ready jobs.
    @Test("the schema lists no lane; every lane serve runs has partial indexes of its ready jobs that depth and the queue lag read through")
    func declaredLanesMatchTheSchema() async throws {
        try await QueueTests.withDatabase { client in
            var checked = 0
            for try await (definition,) in try await client.query(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname IN ('jobs_lane_check', 'job_attempts_lane_check')"
            ).decode((String,).self) {
                #expect(!Lane.all.contains { definition.contains("'\($0.rawValue)'") }, "a lane listed in \(definition)")
                checked += 1
            }
            #expect(checked == 2)
            for lane in Lane.all {
                for condition in JobQueue.readyConditions(lane) {
                    var plan = ""
                    try await client.withConnection { connection in
                        _ = try await connection.query("SET enable_seqscan = off", logger: Self.logger)
                        for try await (line,) in try await connection.query(
                            PostgresQuery(unsafeSQL: "EXPLAIN SELECT min(run_at) FROM jobs WHERE \(condition)"), logger: Self.logger
                        ).decode((String,).self) { plan += line + "\n" }
                    }
                    #expect(plan.contains("Index") && !plan.contains("Seq Scan") && !plan.contains("Filter: (lane"), "\(lane): \(condition)\n\(plan)")
                }
            }
        }
    }

    @Test("a delivery's lease is rescued only once it has run out, then retried, then discarded when out of attempts")
    func rescueAfterLease() async throws {
        try await Self.withAppliedEffects(1) { (client: PostgresClient, queue: JobQueue) async throws in
            let start = Date()
            let claimed = try await queue.claimDeliveries(lane: .callbacks, worker: "d1", limit: 10, lease: .seconds(60), now: start)
            #expect(claimed.count == 1)
            #expect(try await queue.rescueExpiredLeases(maxAttempts: 2, now: start.addingTimeInterval(30)) == 0)
            #expect(try await Self.depth(queue, .callbacks, .running) == 1)
            #expect(try await queue.rescueExpiredLeases(maxAttempts: 2, now: start.addingTimeInterval(90)) == 1)
            #expect(try await Self.depth(queue, .callbacks, .retryable) == 1)
            let attempts = try await queue.attempts(notificationID: try #require(claimed.first?.notificationID))
            #expect(attempts.map(\.outcome) == [.applied, .leaseExpired])
            #expect(attempts.map(\.lane) == [.effects, .callbacks])
            // Ready again from the rescue's time on; its second lease runs out too: out of attempts.
            #expect(try await queue.claimDeliveries(lane: .callbacks, worker: "d2", limit: 10, lease: .seconds(60), now: start.addingTimeInterval(80)).isEmpty)
            let again = try await queue.claimDeliveries(lane: .callbacks, worker: "d2", limit: 10, lease: .seconds(60), now: start.addingTimeInterval(100))
            #expect(again.map(\.attempt) == [2])
            #expect(try await queue.rescueExpiredLeases(maxAttempts: 2, now: start.addingTimeInterval(200)) == 1)
            #expect(try await Self.depth(queue, .callbacks, .discarded) == 1)
            _ = client
        }
    }

    @Test("a heartbeat extends a lease from the time it beats, and only for the worker holding it")
    func heartbeatExtendsLease() async throws {
        try await Self.withAppliedEffects(1) { (_: PostgresClient, queue: JobQueue) async throws in
            let start = Date()
            let claimed = try await queue.claimDeliveries(lane: .callbacks, worker: "d1", limit: 10, lease: .seconds(60), now: start)
            try await queue.heartbeat(worker: "someone-else", jobs: claimed.map(\.id), lease: .seconds(600), now: start)
            try await queue.heartbeat(worker: "d1", jobs: claimed.map(\.id), lease: .seconds(60), now: start.addingTimeInterval(50))
            #expect(try await queue.rescueExpiredLeases(maxAttempts: 5, now: start.addingTimeInterval(100)) == 0)
            #expect(try await queue.rescueExpiredLeases(maxAttempts: 5, now: start.addingTimeInterval(120)) == 1)
        }
    }

    @Test("finished jobs are pruned once they are older than the retention at the time given; their attempts stay")
    func pruneByRetention() async throws {
        try await Self.withAppliedEffects(3) { (client: PostgresClient, queue: JobQueue) async throws in
            let now = Date()
            #expect(try await queue.prune(retention: .seconds(3600), now: now) == 0)
            #expect(try await queue.prune(retention: .seconds(3600), now: now.addingTimeInterval(7200)) == 3)
            // The three callbacks are still to be delivered: not finished, not pruned.
            #expect(try await Self.depth(queue, .callbacks, .available) == 3)
            #expect(try await QueueTests.count(client, "SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 3)
        }
    }

    @Test("the history pruner and a replay of the same notification at once: a notification replayed while the pruner waits is kept with its jobs; one pruned while the replay waits is not replayed, and no job is left without it")
    func pruneAndReplayRace() async throws {
        try await Self.withAppliedEffects(2) { (client: PostgresClient, queue: JobQueue) async throws in
            let notifications = NotificationStore(client: client, logger: Self.logger)
            let jtis = try await Self.strings(client, "SELECT jti FROM notifications ORDER BY id")
            // A replay of the first holds its row (as replayEffect's statement does until it commits); the pruner waits on it.
            try await client.withConnection { replay in
                try await replay.query("BEGIN", logger: Self.logger)
                try await replay.query("UPDATE notifications SET status = 'pending' WHERE jti = \(jtis[0])", logger: Self.logger)
                try await replay.query("UPDATE jobs SET state = 'available', finished_at = NULL WHERE lane = 'effects' AND notification_id = (SELECT id FROM notifications WHERE jti = \(jtis[0]))", logger: Self.logger)
                let pruning = Task { try await notifications.prune(retention: .zero) }
                let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH old AS%'"
                #expect(try await DatabaseEvents.waitForLockWaiters(client, waiting, reach: 1), "the pruner never waited on the replay")
                try await replay.query("COMMIT", logger: Self.logger)
                #expect(try await pruning.value == 1, "only the notification nobody reopened")
            }
            #expect(try await Self.strings(client, "SELECT jti FROM notifications") == [jtis[0]])
            #expect(try await QueueTests.count(client, "SELECT count(*) FROM jobs WHERE state = 'available' AND lane = 'effects'") == 1)
            #expect(try await QueueTests.count(client, "SELECT count(*) FROM jobs j LEFT JOIN notifications n ON n.id = j.notification_id WHERE n.id IS NULL") == 0)

            // The pruner's delete (its jobs go with it) holds the row until it commits; replayEffect waits on it.
            try await client.query("UPDATE notifications SET status = 'applied'")
            try await client.withConnection { pruner in
                try await pruner.query("BEGIN", logger: Self.logger)
                try await pruner.query("DELETE FROM notifications WHERE jti = \(jtis[0])", logger: Self.logger)
                let replaying = Task { try await queue.replayEffect(jti: jtis[0]) }
                let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH target AS%'"
                #expect(try await DatabaseEvents.waitForLockWaiters(client, waiting, reach: 1), "the replay never waited on the pruner")
                try await pruner.query("COMMIT", logger: Self.logger)
                #expect(try await replaying.value == false, "nothing left to replay")
            }
            #expect(try await QueueTests.count(client, "SELECT count(*) FROM jobs") == 0, "no job without its notification")
        }
    }

    @Test("a replay of a notification whose job a batch holds waits for the batch, which applies and commits, then replays: no deadlock")
    func replayWaitsForTheBatch() async throws {
        try await QueueTests.withDatabase { client in
            let queue = JobQueue(client: client, logger: Self.logger)
            try await QueueTests.insertJob(client, jti: "held", sub: "user-1", seconds: 0, logger: Self.logger)
            try await client.withConnection { batch in
                // A batch's order: its claim locks the job, its completion updates the notification.
                try await batch.query("BEGIN", logger: Self.logger)
                try await batch.query("SELECT id FROM jobs WHERE lane = 'effects' FOR UPDATE", logger: Self.logger)
                let replaying = Task { try await queue.replayEffect(jti: "held") }
                let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH target AS%'"
                #expect(try await DatabaseEvents.waitForLockWaiters(client, waiting, reach: 1), "the replay never waited on the batch")
                try await batch.query("UPDATE notifications SET status = 'applied' WHERE jti = 'held'", logger: Self.logger)
                try await batch.query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE lane = 'effects'", logger: Self.logger)
                try await batch.query("COMMIT", logger: Self.logger)
                #expect(try await replaying.value == true)
            }
            #expect(try await Self.strings(client, "SELECT status::text FROM notifications") == ["pending"])
            #expect(try await Self.strings(client, "SELECT state::text FROM jobs") == ["available"])
        }
    }

    static func strings(_ client: PostgresClient, _ sql: String) async throws -> [String] {
        var values: [String] = []
        for try await (value,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((String,).self) { values.append(value) }
        return values
    }

    @Test("a failed effect job waits out its backoff: claimed only once the time given is past it")
    func retryAfterBackoff() async throws {
        try await QueueTests.withDatabase { client in
            try await BulkLoad.notifications(count: 1, users: 1, aud: "com.example.app", client: client)
            try await client.query(
                """
                CREATE FUNCTION refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$
                """)
            try await client.query("CREATE TRIGGER refuse_all BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refuse_all()")
            let store = EffectStore(client: client, logger: Self.logger)
            let failed = await #expect(throws: EffectStore.BatchFailed.self) {
                try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true)
            }
            let job = try #require(failed?.jobs.first)
            let outcome = try await store.runOne(job, worker: "w", eraseOnDelete: true, maxAttempts: 5) { _ in .seconds(3600) }
            guard case .failed(_, let discarded) = outcome else {
                Issue.record("expected a failed attempt, got \(outcome)")
                return
            }
            #expect(!discarded)
            try await client.query("DROP TRIGGER refuse_all ON accounts")
            #expect(try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true).claimed.isEmpty)
            #expect(try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true, now: Date().addingTimeInterval(1800)).claimed.isEmpty)
            let retried = try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true, now: Date().addingTimeInterval(7200))
            #expect(retried.claimed.map(\.attempt) == [2])
            #expect(retried.applied.count == 1)
            let attempts = try await JobQueue(client: client, logger: Self.logger).attempts(notificationID: job.notificationID)
            #expect(attempts.map(\.outcome) == [.retrying, .applied])
        }
    }

    /// The queue writes `jobs` only; a trigger carries each effect job's new state to its
    /// notification, whichever statement changed it (a failure, a discard, the generic lane retry,
    /// a claim, a commit).
    @Test("a notification's status follows its effect job through failure, discard, lane retry, claim and commit; a claim leaves it as it was")
    func statusFollowsTheEffectJob() async throws {
        try await QueueTests.withDatabase { client in
            try await BulkLoad.notifications(count: 1, users: 1, aud: "com.example.app", client: client)
            let status = { try await Self.strings(client, "SELECT status::text FROM notifications") }
            #expect(try await status() == ["pending"])
            try await client.query(
                "CREATE FUNCTION refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$")
            try await client.query("CREATE TRIGGER refuse_all BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refuse_all()")
            let store = EffectStore(client: client, logger: Self.logger)
            let failed = await #expect(throws: EffectStore.BatchFailed.self) {
                try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true)
            }
            let job = try #require(failed?.jobs.first)
            _ = try await store.runOne(job, worker: "w", eraseOnDelete: true, maxAttempts: 5) { _ in .zero }
            #expect(try await status() == ["retrying"])
            // A claim (the job running) leaves the status: a retried notification reads retrying while it runs.
            try await client.query("UPDATE jobs SET state = 'running', locked_by = 'w', lease_expires_at = now() + interval '1 minute'")
            #expect(try await status() == ["retrying"])
            try await client.query("UPDATE jobs SET state = 'retryable', locked_by = NULL, lease_expires_at = NULL")
            let again = await #expect(throws: EffectStore.BatchFailed.self) {
                try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true, now: Date().addingTimeInterval(60))
            }
            _ = try await store.runOne(try #require(again?.jobs.first), worker: "w", eraseOnDelete: true, maxAttempts: 1) { _ in .zero }
            #expect(try await status() == ["discarded"])
            #expect(try await JobQueue(client: client, logger: Self.logger).retry(lane: .effects, id: nil, discarded: true) == 1)
            #expect(try await status() == ["pending"])
            try await client.query("DROP TRIGGER refuse_all ON accounts")
            #expect(try await store.runBatch(worker: "w", limit: 10, eraseOnDelete: true).applied.count == 1)
            #expect(try await status() == ["applied"])
        }
    }
}
