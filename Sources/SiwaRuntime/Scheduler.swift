import Logging
import ServiceLifecycle

/// What a loop does after a round: go again at once (it found work), wait its interval (or a
/// ring of its doorbell), or wait a time of its own choosing.
package enum Pace: Sendable, Equatable {
    case again
    case idle
    /// Wait `after` (a ring meanwhile is kept, not lost), then up to this long for a ring of the
    /// doorbell: the loop chose its own idle wait, and spaces its rounds at least `after` apart.
    case idleFor(Duration, after: Duration = .zero)
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
    /// Graceful shutdown ends the loop. Off for a helper its owner cancels when done (a lease
    /// heartbeat must outlive the deliveries still finishing).
    package var stopsOnGracefulShutdown = true

    package init(interval: Duration, doorbell: Doorbell? = nil) {
        self.interval = interval
        self.doorbell = doorbell
    }

    /// A maintenance round every `interval`: abandoned on shutdown (each step is its own
    /// transaction, redone by the next round), retried after `retry` when it fails.
    package static func periodic(every interval: Duration, retryAfter retry: Duration) -> Schedule {
        var schedule = Schedule(interval: interval)
        schedule.abandonOnShutdown = true
        (schedule.errorDelay, schedule.maximumErrorDelay) = (retry, retry)
        return schedule
    }
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
                        case .idle: await (doorbell.isClosed ? pause : doorbell).wait(timeout: schedule.interval)
                        case .idleFor(let wait, let gap):
                            if gap > .zero { await pause.wait(timeout: gap) }
                            if !stopping() { await (doorbell.isClosed ? pause : doorbell).wait(timeout: wait) }
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
