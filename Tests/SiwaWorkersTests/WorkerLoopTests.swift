import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaDomain
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The background loops driven one round at a time (`runOnce`), on rows already past due.
@Suite("Worker loops, one round at a time", .timeLimit(.minutes(10)))
struct WorkerLoopTests {
    @Test("Finished jobs past their retention are pruned by the maintainer's round, once a minute; jobs still to run are kept")
    func jobRetention() async throws {
        let e = try await EffectHarness.start { $0.upkeep.retention = .zero }
        try await e.post("consent-revoked", sub: "kept-1", at: 1_000)
        try await e.post("consent-revoked", sub: "kept-2", at: 1_000)
        #expect(try await e.drain() == 2)
        try await e.post("consent-revoked", sub: "waiting", at: 1_000)
        let started = ContinuousClock.now
        #expect(try await e.workers.maintainer.runOnce(now: started) == MaintenanceRound(rescued: 0, pruned: 2))
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'effects' AND state = 'completed'") == 0)
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE lane = 'effects' AND state = 'available'") == 1)
        #expect(try await e.drain() == 1)
        #expect(try await e.workers.maintainer.runOnce(now: started + .seconds(30)) == MaintenanceRound(rescued: 0, pruned: nil), "not due yet")
        #expect(try await e.h.count("SELECT count(*) FROM jobs WHERE state = 'completed'") == 1)
        #expect(try await e.workers.maintainer.runOnce(now: started + .seconds(60)) == MaintenanceRound(rescued: 0, pruned: 1))
        #expect(try await e.h.count("SELECT count(*) FROM jobs") == 0)
        await e.stop()
    }

    @Test("Notifications and rejections past the history retention are pruned by the pruner's round; notifications still pending are kept")
    func historyAndRejectionRetention() async throws {
        let e = try await EffectHarness.start { $0.history.retention = .zero }
        try await e.post("consent-revoked", sub: "old", at: 1_000)
        #expect(try await e.drain() == 1)
        #expect(try await e.h.server.post(jws: try e.h.forged(header: ["kid": .string("forged"), "alg": .string("RS256")])).status != 200)
        await e.h.flushRejections()
        #expect(try await e.h.count("SELECT count(*) FROM rejections") == 1)
        try await e.post("consent-revoked", sub: "pending", at: 1_000)
        let round = try await e.workers.historyPruner.runOnce()
        #expect(round.notifications == 1)
        #expect(try await e.h.count("SELECT count(*) FROM rejections") == 0)
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'pending'") == 1)
        #expect(try await e.h.count("SELECT count(*) FROM notifications WHERE sub = 'old'") == 0)
        #expect(try await e.workers.historyPruner.runOnce() == HistoryPruneRound())
        await e.stop()
    }

    @Test("The stats folder's round folds every delta the ingest appended; the next finds none")
    func statsFolded() async throws {
        let e = try await EffectHarness.start()
        try await e.post("consent-revoked", sub: "s1", at: 1_000)
        try await e.post("account-delete", sub: "s2", at: 1_000)
        #expect(try await e.h.count("SELECT count(*) FROM notification_count_deltas") > 0)
        #expect(try await e.workers.statsFolder.runOnce() > 0)
        #expect(try await e.h.count("SELECT count(*) FROM notification_count_deltas") == 0)
        #expect(try await e.h.count("SELECT coalesce(sum(count), 0)::int FROM notification_counts") == 2)
        #expect(try await e.workers.statsFolder.runOnce() == 0)
        await e.stop()
    }

    @Test("The rejection writer's round writes the buffered rejections and their minute counts; the next writes nothing")
    func rejectionsWritten() async throws {
        let h = try await Harness.start()
        // A writer of its own (the server's runs in the background every second).
        let recorder = RejectionRecorder(
            store: RejectionStore(client: h.server.client, logger: h.logs.logger()), limitPerMinute: 100, metrics: nil, logger: h.logs.logger())
        for index in 0..<3 {
            recorder.record(RejectionRecord(receivedAt: Date(), remoteAddress: "192.0.2.1", reason: .unknownKey, message: "kid forged-\(index)", bodySize: 10, bodyPrefix: Array("forged-\(index)".utf8)))
        }
        #expect(try await h.count("SELECT count(*) FROM rejections") == 0, "buffered, not written yet")
        #expect(await recorder.runOnce() == RejectionRecorder.Written(rows: 3, minutes: 1))
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'unknown_key'") == 3)
        #expect(await recorder.runOnce() == RejectionRecorder.Written())
        await h.stop()
    }

    @Test("Another process takes over alert evaluation once the holder's lease has run out; the old holder then stands by")
    func alertLeaseTakeover() async throws {
        let e = try await EffectHarness.start()
        let store = AlertStore(client: e.client, logger: e.h.logs.logger())
        let first = AlertMonitor(configuration: .init(), store: store, logger: e.h.logs.logger(), identity: "first")
        let second = AlertMonitor(configuration: .init(), store: store, logger: e.h.logs.logger(), identity: "second")
        func evaluated(_ round: AlertMonitor.AlertRound) -> Bool {
            if case .evaluated = round { return true }
            return false
        }
        // The lease lasts three evaluation intervals and 5 s.
        let ttl = AlertMonitor.Configuration().rules.spike.interval * 3 + .seconds(5)
        let start = Date()
        func at(_ offset: Duration) -> Date { start.addingTimeInterval(offset.timeInterval) }
        #expect(evaluated(try await first.runOnce(now: start, leaseNow: start)))
        #expect(!evaluated(try await second.runOnce(now: start, leaseNow: start)), "the lease is held")
        #expect(evaluated(try await first.runOnce(now: at(.seconds(10)), leaseNow: at(.seconds(10)))), "the holder renews its lease")
        #expect(!evaluated(try await second.runOnce(now: at(ttl + .seconds(5)), leaseNow: at(ttl + .seconds(5)))), "renewed: held past the first lease's end")
        // The first process dies: nothing renews its lease, which runs out.
        let later = at(.seconds(10) + ttl + .seconds(1))
        #expect(evaluated(try await second.runOnce(now: later, leaseNow: later)), "taken over")
        #expect(!evaluated(try await first.runOnce(now: later, leaseNow: later)), "the old holder stands by")
        #expect(try await e.h.count("SELECT count(*) FROM leases WHERE name = 'alerts' AND holder = 'second'") == 1)
        await e.stop()
    }
}
