import Logging
import ServiceLifecycle

/// What a loop does after a round: go again at once (it found work), wait its interval (or a
/// ring of its doorbell), or wait a time of its own choosing.
package enum Pace: Sendable, Equatable {
    case again
    case idle
    /// Wait up to this long for a ring of the doorbell (the loop chose its own idle wait).
    case idleFor(Duration)
    case after(Duration)
}

/// When a loop runs: every `interval` while idle, early on a ring of `doorbell`, after
/// `errorDelay` (doubling up to `maximumErrorDelay`) while its rounds fail.
package struct Schedule: Sendable {
    package var interval: Duration
    package var doorbell: Doorbell?
    package var errorDelay: Duration = .seconds(1)
    package var maximumErrorDelay: Duration = .seconds(1)
    /// Wait this long before the first round (nil: run at once).
    package var firstWait: Duration?
    /// Graceful shutdown abandons a round in progress (each is its own transaction, so the next
    /// round, here or in another process, redoes it) instead of waiting for it.
    package var abandonOnShutdown = false
    /// Idle rounds start on multiples of `interval` since the process began, so the periodic
    /// loops of a process wake together and one pooled connection serves them all: at rest each
    /// round on a clock of its own opened a connection of its own (the pool closes idle ones
    /// after 5 s), and each connection costs the server a fork and catalog reads.
    package var aligned = false
    /// Aligned: how far past each multiple of `interval` the round starts.
    package var phase: Duration = .zero
    /// With a doorbell: at least this long between rounds, however often it rings (a ring
    /// meanwhile is kept for the wait that follows).
    package var minimumGap: Duration?
    /// Graceful shutdown ends the loop. Off for a helper its owner cancels when done (a lease
    /// heartbeat must outlive the deliveries still finishing).
    package var stopsOnGracefulShutdown = true

    package init(interval: Duration, doorbell: Doorbell? = nil) {
        self.interval = interval
        self.doorbell = doorbell
    }

    /// A maintenance round every `interval`: abandoned on shutdown (each step is its own
    /// transaction, redone by the next round), retried after `retry` when it fails.
    /// `phase`: where in each interval it runs (`Phase`), so the loops of a process take turns on
    /// one pooled connection instead of each opening its own at the same instant.
    package static func periodic(every interval: Duration, retryAfter retry: Duration, phase: Duration = .zero) -> Schedule {
        var schedule = Schedule(interval: interval)
        schedule.abandonOnShutdown = true
        schedule.aligned = true
        schedule.phase = phase
        (schedule.errorDelay, schedule.maximumErrorDelay) = (retry, retry)
        return schedule
    }
}

extension Schedule {
    /// Where aligned schedules count their multiples from.
    static let epoch = ContinuousClock.now

    /// How long an idle round waits at `now`: `interval`, or to the next multiple of it.
    func idleWait(now: ContinuousClock.Instant = .now) -> Duration {
        guard aligned, interval > .zero else { return interval }
        let step = interval.totalAttoseconds
        let left = step - (now - Self.epoch - phase).totalAttoseconds % step
        let second: Int128 = 1_000_000_000_000_000_000
        return Duration(secondsComponent: Int64(left / second), attosecondsComponent: Int64(left % second))
    }
}

/// Where each periodic loop runs within its interval: apart by more than a round takes, and
/// within the pool's 5 s idle timeout of each other.
package enum Phase {
    package static let queue: Duration = .zero
    package static let alerts: Duration = .milliseconds(500)
    package static let history: Duration = .milliseconds(1_000)
    package static let stats: Duration = .milliseconds(1_500)
    package static let apple: Duration = .milliseconds(2_000)
    package static let endpoint: Duration = .milliseconds(2_500)
}

extension Duration {
    var totalAttoseconds: Int128 { Int128(components.seconds) * 1_000_000_000_000_000_000 + Int128(components.attoseconds) }
}

/// The one loop runner of every background service: runs `once` until graceful shutdown (or
/// cancellation), paced by `pace` and the schedule. A failed round is reported to `onError` and
/// retried after the error delay; a round failing because the process is stopping is not reported.
package enum Scheduler {
    package static func run<Round: Sendable>(
        _ schedule: Schedule,
        once: @escaping @Sendable () async throws -> Round,
        pace: (Round) -> Pace = { _ in .idle },
        onError: (any Error) -> Void
    ) async {
        let doorbell = schedule.doorbell ?? Doorbell()
        // Never rung: a pause only shutdown cuts short (a ring must not end an error's delay).
        let pause = Doorbell()
        func stopping() -> Bool { Task.isCancelled || (schedule.stopsOnGracefulShutdown && Task.isShuttingDownGracefully) }
        let stop: @Sendable () -> Void = {
            doorbell.close()
            pause.close()
        }
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                if let first = schedule.firstWait, !stopping() { await pause.wait(timeout: first) }
                var failures = 0
                while !stopping() {
                    do {
                        let round = schedule.abandonOnShutdown ? try await cancelWhenGracefulShutdown { try await once() } : try await once()
                        failures = 0
                        if stopping() { break }
                        switch pace(round) {
                        case .again: continue
                        // A doorbell closed by another loop sharing it (each its own service, shut
                        // down one at a time) answers at once: this loop polls until its own turn.
                        case .idle:
                            if let gap = schedule.minimumGap { await pause.wait(timeout: gap) }
                            if !stopping() { await (doorbell.isClosed ? pause : doorbell).wait(timeout: schedule.idleWait()) }
                        case .idleFor(let wait): await (doorbell.isClosed ? pause : doorbell).wait(timeout: wait)
                        case .after(let delay): await pause.wait(timeout: delay)
                        }
                    } catch {
                        if stopping() { break }
                        onError(error)
                        let delay = min(schedule.errorDelay * (1 << min(failures, 16)), max(schedule.errorDelay, schedule.maximumErrorDelay))
                        failures += 1
                        await pause.wait(timeout: delay)
                    }
                }
            } onGracefulShutdown: {
                if schedule.stopsOnGracefulShutdown { stop() }
            }
        } onCancel: {
            stop()
        }
    }
}
