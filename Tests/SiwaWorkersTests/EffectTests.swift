import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import ServiceLifecycleTestKit
import Testing

@Suite("Effects: the worker applies notifications to accounts and sessions", .timeLimit(.minutes(10)))
struct EffectTests {
    @Test("email-disabled, then email-enabled: forwarding and address follow; the notifications end applied")
    func emailEffects() async throws {
        let e = try await EffectHarness.start()
        try await e.post("email-disabled", sub: "u1", at: 1_000_000, email: "u1@privaterelay.appleid.com")
        #expect(try await e.drain() == 1)
        let got1 = try await e.account(sub: "u1")

        #expect(got1 == "disabled|u1@privaterelay.appleid.com|true|1000000|-|-")
        try await e.post("email-enabled", sub: "u1", at: 2_000_000)
        try await e.drain()
        let got2 = try await e.account(sub: "u1")

        #expect(got2 == "enabled|u1@privaterelay.appleid.com|true|2000000|-|-")
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE status = 'applied'") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE state = 'completed'") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 2)
        await e.stop()
    }

    @Test("consent-revoked signs out sessions created at or before it; a session created after it survives")
    func consentRevoked() async throws {
        let e = try await EffectHarness.start()
        let before = try await e.session(sub: "u2", createdAt: 1_000)
        let at = try await e.session(sub: "u2", createdAt: 5_000)
        let after = try await e.session(sub: "u2", createdAt: 9_000)
        let other = try await e.session(sub: "someone-else", createdAt: 1_000)
        try await e.post("consent-revoked", sub: "u2", at: 5_000, jti: "revoke-u2")
        try await e.drain()
        let got3 = try await e.activeSessions(sub: "u2")

        #expect(got3 == [after])
        let got4 = try await e.activeSessions(sub: "someone-else")

        #expect(got4 == [other])
        #expect(try await e.h.count("SELECT count(*) FROM sessions WHERE id IN ('\(before)', '\(at)') AND revoked_reason = 'consent-revoked' AND revoked_by = 'revoke-u2'") == 2)
        let got5 = try await e.account(sub: "u2")

        #expect(got5 == "-|-|-|-|5000|-")
        await e.stop()
    }

    @Test("account-delete revokes every session, and a later-arriving older email event does not store the address again")
    func accountDelete() async throws {
        let e = try await EffectHarness.start()
        _ = try await e.session(sub: "u3", createdAt: 1_000)
        _ = try await e.session(sub: "u3", createdAt: 99_000)
        try await e.post("email-disabled", sub: "u3", at: 1_000, email: "u3@privaterelay.appleid.com")
        try await e.post("account-delete", sub: "u3", at: 50_000)
        try await e.drain()
        #expect(try await e.activeSessions(sub: "u3").isEmpty)
        let got6 = try await e.account(sub: "u3")

        #expect(got6 == "-|-|-|-|-|50000")
        // Delayed delivery of an older email event: nothing stored.
        try await e.post("email-enabled", sub: "u3", at: 2_000, email: "u3-late@privaterelay.appleid.com")
        try await e.drain()
        let got7 = try await e.account(sub: "u3")

        #expect(got7 == "-|-|-|-|-|50000")
        await e.stop()
    }

    @Test("Erasure leaves no trace of the address in any text, jsonb or bytea column of any table")
    func erasureLeavesNoTrace() async throws {
        let e = try await EffectHarness.start()
        let email = "erase-me-7q@privaterelay.appleid.com"
        try await e.post("email-disabled", sub: "u4", at: 1_000, email: email)
        // A genuine token for another app of ours, kept whole among rejections.
        let kept = try e.h.signer.notification(aud: "com.example.typo", type: "email-enabled", sub: "u4", email: email, isPrivateEmail: true, jti: "kept-other")
        #expect(try await e.h.server.post(jws: kept).json?["reason"] == .string("wrong_audience"))
        // Signed events without a type (skipped as unreadable), for us and for another app of
        // ours: their rows name the user, so erasure finds them.
        for (aud, jti) in [(Harness.aud, "untyped-ours"), ("com.example.typo", "untyped-other")] {
            let iat = Date().timeIntervalSince1970.rounded(.down)
            let untyped = try e.h.signer.sign(
                header: .object(["kid": .string(e.h.signer.kid), "alg": .string("RS256")]),
                claims: .object([
                    "iss": .string(NotificationVerifier.appleIssuer), "aud": .string(aud), "iat": .number(iat), "exp": .number(iat + 600),
                    "jti": .string(jti), "events": .string(#"{"sub":"u4","email":"\#(email)","is_private_email":"true","event_time":1700000001500}"#),
                ]))
            _ = try await e.h.server.post(jws: untyped)
        }
        await e.h.flushRejections()
        try await e.drain()
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE jti = 'untyped-ours' AND sub = 'u4' AND type IS NULL") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM rejections WHERE jti = 'untyped-other' AND sub = 'u4'") == 1)
        // The other app's token is kept whole (it holds the address) until the erasure.
        #expect(try await e.h.count("SELECT count(*) FROM rejections WHERE jti = 'kept-other' AND sub = 'u4' AND token IS NOT NULL") == 1)
        #expect(try await DatabaseSearch.occurrences(of: email, in: e.client) > 0)
        try await e.post("account-delete", sub: "u4", at: 2_000)
        try await e.drain()
        // Kept in one place only, on purpose: the suppression list, as "do not mail" (issue 44).
        #expect(try await DatabaseSearch.occurrences(of: email, in: e.client, except: ["suppressions", "suppression_changes"]) == 0)
        #expect(try await e.h.count("SELECT count(*) FROM suppressions WHERE sub = 'u4' AND suppressed AND reason = 'account_deleted'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'u4' AND erased_at IS NOT NULL") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM rejections WHERE jti = 'kept-other' AND token IS NULL AND key_jwk IS NULL") == 1)
        await e.stop()
    }


    @Test("After an effect commits, LISTEN siwa_effects receives the payload reference.md states: type, aud, sub, jti, effect, revoked_sessions, and no address")
    func effectNotification() async throws {
        let e = try await EffectHarness.start()
        try await e.session(sub: "notify-1", createdAt: 0)
        try await e.session(sub: "notify-1", createdAt: 5)
        let payload = try await e.client.withConnection { connection in
            try await connection.listen(on: "siwa_effects") { notifications in
                try await e.post("email-disabled", sub: "notify-1", at: 8, email: "notify-me@privaterelay.appleid.com", jti: "notify-email")
                try await e.post("consent-revoked", sub: "notify-1", at: 10, jti: "notify-jti")
                try await e.drain()
                var payloads: [String] = []
                for try await notification in notifications {
                    payloads.append(notification.payload)
                    if payloads.count == 2 { break }
                }
                return payloads
            }
        }
        let objects = payload.compactMap { JSONValue.parse(Data($0.utf8)) }
        #expect(objects.count == 2)
        let revoked = try #require(objects.first { $0["jti"] == .string("notify-jti") })
        #expect(revoked.objectValue.map { Set($0.keys) } == ["type", "aud", "sub", "jti", "effect", "revoked_sessions"])
        #expect(revoked["type"] == .string("consent-revoked") && revoked["aud"] == .string(Harness.aud) && revoked["sub"] == .string("notify-1"))
        #expect(revoked["revoked_sessions"] == .number(2), "\(revoked)")
        #expect(!payload.joined().contains("notify-me"), "no address in a payload any role can read")
        await e.stop()
    }

    @Test("Every out-of-order pair of a user's events ends as in event_time order (accounts and sessions)")
    func outOfOrderPairs() async throws {
        let events: [(String, Int64, String?)] = [
            ("email-disabled", 10_000, "a@privaterelay.appleid.com"), ("email-enabled", 20_000, nil), ("consent-revoked", 30_000, nil),
            ("account-delete", 40_000, nil),
        ]
        let e = try await EffectHarness.start()
        var pairIndex = 0
        for i in events.indices {
            for j in events.indices where i < j {
                pairIndex += 1
                let inOrder = "in-\(pairIndex)", reversed = "rev-\(pairIndex)"
                for sub in [inOrder, reversed] {
                    for created in [5_000, 15_000, 25_000, 35_000, 45_000] as [Int64] { try await e.session(sub: sub, createdAt: created) }
                }
                for (type, time, email) in [events[i], events[j]] { try await e.post(type, sub: inOrder, at: time, email: email) }
                try await e.drain()
                for (type, time, email) in [events[j], events[i]] {
                    try await e.post(type, sub: reversed, at: time, email: email)
                    try await e.drain()  // the later event is applied first
                }
                let inOrderAccount = try await e.account(sub: inOrder), reversedAccount = try await e.account(sub: reversed)
                #expect(inOrderAccount == reversedAccount, "\(events[i].0) / \(events[j].0)")
                #expect(try await e.h.count(
                    "SELECT count(*) FROM sessions WHERE sub = '\(inOrder)' AND revoked_at IS NULL") == (try await e.h.count(
                    "SELECT count(*) FROM sessions WHERE sub = '\(reversed)' AND revoked_at IS NULL")))
                #expect(try await e.h.count(
                    "SELECT count(*) FROM (SELECT created_at, revoked_reason FROM sessions WHERE sub = '\(inOrder)' EXCEPT SELECT created_at, revoked_reason FROM sessions WHERE sub = '\(reversed)') d") == 0)
            }
        }
        await e.stop()
    }

    @Test("A worker that dies or stalls mid-batch holds its jobs only while its transaction lives (PostgreSQL ends one idle past the lease): then they are ready, applied exactly once, no attempt spent", arguments: [false, true])
    func deadOrStalledWorkerMidBatch(stalls: Bool) async throws {
        let e = try await EffectHarness.start()
        try await e.session(sub: "u5", createdAt: 1_000)
        try await e.post("consent-revoked", sub: "u5", at: 5_000)
        try await e.post("account-delete", sub: "u5", at: 6_000)
        let logger = Logger(label: "dead")
        // A worker claims (its transaction locks the user's first job) and stops there.
        try await e.client.withConnection { connection in
            var backend = 0
            for try await (pid,) in try await connection.query("SELECT pg_backend_pid()", logger: logger).decode((Int,).self) { backend = pid }
            // Watched from now, while it certainly lives (the test cluster runs on this machine).
            let backendEnd = try ProcessEnd(pid: pid_t(backend))
            try await connection.query("BEGIN", logger: logger)
            var claimed = 0
            // A long lease while the test looks (however slow the machine, the claim still holds
            // when it checks); the stalled worker's then shortened to 1 s by its last statement.
            for try await _ in try await connection.execute(JobQueue.Effects.Claim(limit: 10, lease: .seconds(120)), logger: logger) { claimed += 1 }
            #expect(claimed == 1)  // one job per user in flight
            #expect(try await e.drain() == 0)  // held: neither it nor its user's later job is claimable
            if stalls {
                try await connection.query("SET LOCAL idle_in_transaction_session_timeout = '1s'", logger: logger)
            } else {
                // The worker dies: its backend goes, its transaction rolls back.
                #expect(try await e.h.count("SELECT pg_terminate_backend(\(backend))::int") == 1)
            }
            // The stalled one never sends another statement (and keeps its connection out of the
            // pool): PostgreSQL ends the transaction, and the session, after 1 s idle. Either way,
            // wait for the backend process to exit: by then it has released its locks and left
            // pg_stat_activity (both happen in its exit path).
            let exited = await backendEnd.exited(within: .seconds(30))
            #expect(exited, "the worker's backend \(backend) did not exit within 30 s (\(stalls ? "idle past its 1 s lease" : "terminated"))")
            #expect(try await e.h.count("SELECT count(*) FROM pg_stat_activity WHERE pid = \(backend)") == 0)
            // Hand the connection back only once this side has seen it close: a pool that leased
            // it again first would fail the next claim on it (the worker loop retries such a
            // claim; `drain` below does not).
            try? await withDeadline(.seconds(10)) { try await connection.closeFuture.get() }
        }
        // Both jobs are ready now (the backend's exit released them): one drain applies both.
        #expect(try await e.drain() == 2)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE outcome = 'applied'") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'effects' AND state = 'completed' AND attempt = 1") == 2)
        #expect(try await e.activeSessions(sub: "u5").isEmpty)
        // In event_time order: the revocation first, then the deletion.
        #expect(try await e.h.count(
            "SELECT count(*) FROM job_attempts a JOIN notifications n ON n.id = a.notification_id WHERE n.type = 'consent-revoked' AND a.id < (SELECT max(id) FROM job_attempts)") == 1)
        await e.stop()
    }

    @Test("A callback whose deliverer died is taken over after its lease; the dead deliverer's late result is not recorded")
    func callbackLeaseTakeover() async throws {
        let e = try await EffectHarness.start { configuration in
            configuration.lanes.callbacks = .init(url: URL(string: "http://127.0.0.1:9/")!, signer: try! WebhookSigner(secrets: TestWebhooks.secret))
        }
        try await e.post("consent-revoked", sub: "u6", at: 5_000)
        #expect(try await e.drain() == 1)
        let store = JobQueue(client: e.client, logger: Logger(label: "dead"))
        let start = Date()
        let held = try await store.claimDeliveries(lane: .callbacks, worker: "dead/callbacks", limit: 10, lease: .seconds(60), now: start)
        #expect(held.count == 1)
        #expect(try await store.claimDeliveries(lane: .callbacks, worker: "alive/callbacks", limit: 10, lease: .seconds(60), now: start.addingTimeInterval(30)).isEmpty)  // held
        // The dead deliverer stops renewing: within its lease nothing is rescued; after it, the job is.
        #expect(try await e.workers.maintainer.runOnce(queueNow: start.addingTimeInterval(59)).rescued == 0)
        #expect(try await e.workers.maintainer.runOnce(queueNow: start.addingTimeInterval(61)).rescued == 1)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE outcome = 'lease_expired' AND lane = 'callbacks'") == 1)
        let taken = try await store.claimDeliveries(lane: .callbacks, worker: "alive/callbacks", limit: 10, lease: .seconds(60), now: start.addingTimeInterval(62))
        #expect(taken.count == 1)
        // The dead deliverer wakes up and reports: not held any more, nothing recorded.
        #expect(try await store.recordDelivery(held[0], worker: "dead/callbacks", outcome: .delivered(status: 200), maxAttempts: 25, delay: .seconds(1)) == nil)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'running' AND locked_by = 'alive/callbacks' AND attempt = 2") == 1)
        await e.stop()
    }

    @Test("Shutdown hands back the deliveries this process holds, as if never attempted, and nothing another process holds")
    func releaseOnShutdown() async throws {
        let e = try await EffectHarness.start { configuration in
            configuration.lanes.callbacks = .init(url: URL(string: "http://127.0.0.1:9/")!, signer: try! WebhookSigner(secrets: TestWebhooks.secret))
        }
        for user in ["r1", "r2", "r3"] { try await e.post("consent-revoked", sub: user, at: 1_000) }
        #expect(try await e.drain() == 3)
        let deliverer = try #require(e.workers.deliverer(.callbacks))
        let callbacks = JobQueue(client: e.client, logger: Logger(label: "release"))
        // Held under this deliverer's name (a claim it gave up on at shutdown, committed after all)
        // and by another process.
        #expect(try await callbacks.claimDeliveries(lane: .callbacks, worker: deliverer.worker, limit: 2, lease: .seconds(60)).count == 2)
        #expect(try await callbacks.claimDeliveries(lane: .callbacks, worker: "elsewhere/callbacks", limit: 10, lease: .seconds(60)).count == 1)
        // SIGTERM: the deliverer stops and hands back what it holds.
        try await testGracefulShutdown { shutdown in
            shutdown.triggerGracefulShutdown()
            try await deliverer.run()
        }
        #expect(e.h.logs.all.contains { $0.contains("released jobs on shutdown") && $0.contains("count=2") }, "\(e.h.logs.all.filter { $0.contains("released") })")
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'callbacks' AND state = 'available' AND attempt = 0 AND locked_by IS NULL") == 2)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE state = 'running' AND locked_by = 'elsewhere/callbacks'") == 1)
        await e.stop()
    }

    @Test("A failing job backs off, is retried, and is discarded with its last error after the maximum attempts")
    func backoffDiscardRetry() async throws {
        let e = try await EffectHarness.start { configuration in
            configuration.queue.maxAttempts = 2
            configuration.queue.backoff = RetryBackoff(base: .seconds(600), cap: .seconds(600))  // still backing off when checked, however slow the machine
        }
        // The database refuses this user's account row: a real failure inside the effect.
        try await e.client.query(
            """
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.sub = 'poison' THEN RAISE EXCEPTION 'poisoned account'; END IF; RETURN NEW; END $$
            """)
        try await e.client.query("CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refuse_poison()")
        try await e.post("consent-revoked", sub: "poison", at: 1_000)
        try await e.post("consent-revoked", sub: "healthy", at: 1_000)
        try await e.drain()
        // The healthy one is applied despite sharing a batch with the poison.
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'healthy' AND status = 'applied'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'poison' AND status = 'retrying'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE state = 'retryable' AND last_error LIKE '%poisoned account%'") == 1)
        // Backing off (at least half of 600 s, with jitter): not claimed now, claimed once past it.
        #expect(try await e.drain() == 0)
        #expect(try await e.drain(now: Date().addingTimeInterval(601)) == 1)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE state = 'discarded' AND finished_at IS NOT NULL") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'poison' AND status = 'discarded'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM job_attempts WHERE outcome IN ('retrying', 'discarded')") == 2)
        // Fixed, then retried by an operator: applied.
        try await e.client.query("DROP TRIGGER refuse_poison ON accounts")
        #expect(try await JobQueue(client: e.client, logger: Logger(label: "op")).retryEffects(jobID: nil, discarded: true, type: nil) == 1)
        try await e.drain()
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'poison' AND status = 'applied'") == 1)
        await e.stop()
    }
}
