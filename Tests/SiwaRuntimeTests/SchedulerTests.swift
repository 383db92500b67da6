import Logging
import ServiceLifecycle
import ServiceLifecycleTestKit
import SiwaRuntime
import Synchronization
import Testing

/// The one loop runner every background service uses: paced by its rounds, woken by its
/// doorbell, backing off on errors, stopped by graceful shutdown or cancellation.
@Suite("Scheduler: rounds, doorbell, errors, shutdown", .timeLimit(.minutes(10)))
struct SchedulerTests {
    /// Rounds reported by a loop under test, awaited one by one (no polling).
    final class Rounds: Sendable {
        let stream: AsyncStream<Int>
        let continuation: AsyncStream<Int>.Continuation
        let count = Mutex(0)
        init() { (stream, continuation) = AsyncStream.makeStream() }
        func round() -> Int {
            let n = count.withLock { count in
                count += 1
                return count
            }
            continuation.yield(n)
            return n
        }
    }

    /// The first time something happened in a loop under test.
    final class Moment: Sendable {
        private let first = Mutex<ContinuousClock.Instant?>(nil)
        func mark() { first.withLock { $0 = $0 ?? ContinuousClock.now } }
        var time: ContinuousClock.Instant? { first.withLock { $0 } }
    }

    /// Waits for `loop` to end by itself, failing (and cancelling it) if it has not within 30 s:
    /// a loop that misses the shutdown fails the test instead of hanging it for its hour.
    static func ended(_ loop: Task<Void, Never>) async throws {
        do {
            try await withDeadline(.seconds(30)) { await loop.value }
        } catch {
            loop.cancel()
            throw error
        }
    }

    @Test("A loop with work goes again at once; idle, it waits a one-hour interval until its doorbell rings")
    func doorbellWakesIdleLoop() async throws {
        let rounds = Rounds()
        let doorbell = Doorbell()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                // Rounds 1 and 2 find work; round 3 finds none.
                await Scheduler.run(Schedule(interval: .seconds(3600), doorbell: doorbell), once: { rounds.round() }, pace: { $0 < 3 ? .again : .idle }) { _ in }
            }
            var iterator = rounds.stream.makeAsyncIterator()
            for expected in 1...3 { #expect(await iterator.next() == expected) }
            doorbell.ring()
            #expect(await iterator.next() == 4, "woken by the ring, not the interval")
            group.cancelAll()  // cancellation ends the hour's wait at once
            try await group.waitForAll()
        }
        #expect(rounds.count.withLock { $0 } == 4)
    }

    @Test("A failed round is reported and retried after the error delay; a ring does not cut that delay short")
    func errorsAreRetried() async throws {
        struct Broken: Error {}
        let rounds = Rounds()
        let doorbell = Doorbell()
        let delay = Duration.milliseconds(300)
        let schedule = {
            var schedule = Schedule(interval: .seconds(3600), doorbell: doorbell)
            (schedule.errorDelay, schedule.maximumErrorDelay) = (delay, delay)
            return schedule
        }()
        let (reported, retried) = (Moment(), Moment())
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                await Scheduler.run(schedule, once: {
                    if rounds.round() == 1 { throw Broken() }
                    retried.mark()
                }) { _ in
                    reported.mark()
                    // Rung as the delay begins, and kept by the doorbell if nobody waits on it yet:
                    // a loop that waited out its error delay on the doorbell would go again at once.
                    doorbell.ring()
                }
            }
            var iterator = rounds.stream.makeAsyncIterator()
            #expect(await iterator.next() == 1)
            #expect(await iterator.next() == 2)
            group.cancelAll()
            try await group.waitForAll()
        }
        // A lower bound only: a slow machine makes the retry later, never earlier.
        let failedAt = try #require(reported.time, "the failure was reported")
        let retriedAt = try #require(retried.time)
        #expect(retriedAt - failedAt >= delay, "retried \(retriedAt - failedAt) after the failure, before its \(delay) delay")
    }

    @Test("Graceful shutdown ends a loop waiting out a one-hour interval")
    func gracefulShutdownEndsWait() async throws {
        let doorbell = Doorbell()
        let rounds = Rounds()
        try await testGracefulShutdown { shutdown in
            let loop = Task {
                await Scheduler.run(Schedule(interval: .seconds(3600), doorbell: doorbell), once: { _ = rounds.round() }) { _ in
                    Issue.record("shutdown is not an error")
                }
            }
            var iterator = rounds.stream.makeAsyncIterator()
            #expect(await iterator.next() == 1)
            // Idle after its round: the loop is waiting out its hour on the doorbell.
            while doorbell.waiting == 0 { await Task.yield() }
            shutdown.triggerGracefulShutdown()
            // Not cancelled: only the shutdown can end the hour early.
            try await Self.ended(loop)
        }
        #expect(rounds.count.withLock { $0 } == 1)
    }

    @Test("Loops sharing a doorbell are shut down one at a time (each its own service): the one still running after another's shutdown closed the doorbell waits out its interval, not spinning")
    func sharedDoorbellClosedByAnother() async throws {
        let doorbell = Doorbell()
        let rounds = Rounds()
        let other = Task {
            await Scheduler.run(Schedule(interval: .seconds(3600), doorbell: doorbell), once: { _ = rounds.round() }) { _ in }
        }
        var iterator = rounds.stream.makeAsyncIterator()
        #expect(await iterator.next() == 1)
        try await testGracefulShutdown { shutdown in
            let first = Task {
                await Scheduler.run(Schedule(interval: .seconds(3600), doorbell: doorbell), once: { _ = rounds.round() }) { _ in }
            }
            #expect(await iterator.next() == 2)
            while doorbell.waiting < 2 { await Task.yield() }
            shutdown.triggerGracefulShutdown()
            try await Self.ended(first)
        }
        // Closing woke the other loop for one more round; its next wait is its hour, not the
        // closed doorbell answering at once (a round each time, as fast as they run).
        #expect(await iterator.next() == 3)
        other.cancel()
        try await Self.ended(other)
        #expect(rounds.count.withLock { $0 } == 3)
    }

    @Test("Graceful shutdown abandons a round in progress when the schedule says so")
    func gracefulShutdownAbandonsRound() async throws {
        let schedule = {
            var schedule = Schedule(interval: .seconds(3600))
            schedule.abandonOnShutdown = true
            return schedule
        }()
        let rounds = Rounds()
        try await testGracefulShutdown { shutdown in
            let loop = Task {
                await Scheduler.run(schedule, once: {
                    // The second round never ends by itself (as a statement that is never answered).
                    if rounds.round() == 2 {
                        let (never, continuation) = AsyncStream<Int>.makeStream()
                        for await _ in never {}
                        continuation.finish()
                    }
                }, pace: { _ in .again }) { _ in Issue.record("shutdown is not an error") }
            }
            var iterator = rounds.stream.makeAsyncIterator()
            #expect(await iterator.next() == 1)
            #expect(await iterator.next() == 2)
            shutdown.triggerGracefulShutdown()
            try await Self.ended(loop)
        }
        #expect(rounds.count.withLock { $0 } == 2)
    }

    @Test("Shutdown wakes a waiter that begins its wait after it, not only the ones already waiting")
    func closedDoorbellWakesLateWaiters() async throws {
        let doorbell = Doorbell()
        doorbell.close()
        try await withDeadline(.seconds(30)) { await doorbell.wait(timeout: .seconds(3600)) }
    }
}
