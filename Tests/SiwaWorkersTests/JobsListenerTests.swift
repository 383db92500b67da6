import Foundation
import PostgresNIO
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The listener is what lets idle loops sleep: its NOTIFYs and its one check per process must
/// find every job a sleeping loop would otherwise have polled for.
@Suite("Jobs listener: NOTIFY and the check wake sleeping loops", .timeLimit(.minutes(10)))
struct JobsListenerTests {
    @Test("The check rings a lane whose job no NOTIFY announced, and looks again when a retry falls due")
    func checkFindsWhatNotifyMissed() async throws {
        let e = try await EffectHarness.start()
        defer { Task { await e.stop() } }
        let listener = try #require(e.workers.listener)
        let effects = try #require(listener.doorbells[.effects])
        // Only the lanes this process runs are checked (no callbacks configured here).
        #expect(listener.doorbells[.callbacks] == nil)

        // Nothing queued: nothing rung, and the next check is a whole interval away.
        #expect(try await listener.check() == listener.checkInterval)
        #expect(!effects.isRung)

        // A notification committed while nobody listened (its NOTIFY is lost).
        try await e.post("consent-revoked", sub: "lost-1", at: 1_000)
        #expect(!effects.isRung)
        #expect(try await listener.check() == listener.checkInterval)
        #expect(effects.isRung, "the check rang the effects lane")
        await effects.wait(timeout: .zero)
        #expect(try await e.drain() == 1)

        // A retry due in 3 s: not rung now; the next check comes when it falls due, not later.
        try await e.post("consent-revoked", sub: "lost-2", at: 2_000)
        try await e.client.query(
            "UPDATE jobs SET state = 'retryable', run_at = now() + interval '3 seconds' WHERE lane = 'effects' AND state = 'available'")
        let next = try await listener.check()
        #expect(!effects.isRung)
        #expect(next > .seconds(2) && next <= .milliseconds(3_100), "next check in \(next)")
        try await e.client.query("UPDATE jobs SET run_at = now() WHERE lane = 'effects' AND state = 'retryable'")
        _ = try await listener.check()
        #expect(effects.isRung)
    }

    @Test("While LISTEN holds, idle loops wait long and a NOTIFY rings its lane and the stats folder; when it ends, they poll again")
    func listenStateFollowsTheSession() async throws {
        let e = try await EffectHarness.start()
        defer { Task { await e.stop() } }
        let listener = try #require(e.workers.listener)
        let effects = try #require(listener.doorbells[.effects])
        let poll = Duration.milliseconds(100)
        #expect(listener.state.idleWait(poll: poll) == poll)

        // A session of 5 s, which ends by itself (the NOTIFY below takes milliseconds).
        let session = Task { try await listener.runOnce(session: .seconds(5)) }
        // The session's first check rings nothing (the queue is empty); LISTEN is then held.
        while !listener.state.isListening { try await Task.sleep(for: .milliseconds(20)) }
        #expect(listener.state.idleWait(poll: poll) == ListenState.quietWait)

        try await e.client.query("SELECT pg_notify('siwa_jobs', '')")
        // The NOTIFY comes back on the listener's connection; wait on the doorbell for it.
        // (The listener rings the stats folder first, then the lane.)
        await effects.wait(timeout: .seconds(20))
        let folder = try #require(listener.activity.first)
        #expect(folder.isRung, "the stats folder is told of ingest")
        let received = try await session.value
        #expect(received == 1, "the session counted \(received) notifications")
        #expect(!listener.state.isListening)
        #expect(listener.state.idleWait(poll: poll) == poll)
    }
}
