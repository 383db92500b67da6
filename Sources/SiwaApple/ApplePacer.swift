/// When a call to Apple may go: the one pacing and 429 policy. Calls are spaced `1/perSecond`
/// apart (nil: unpaced), and after Apple answers 429 every call waits out its `Retry-After` (or
/// `pauseAfterLimit`) first. Time is the injected clock's, so a test moves it instead of waiting.
package protocol ApplePacing: Sendable {
    /// Waits until a call may go.
    func admit() async throws
    /// Apple answered 429: calls wait `retryAfter` (or the default pause) from now.
    func limited(retryAfter: Duration?) async
}

package actor ApplePacer<C: Clock>: ApplePacing where C.Duration == Duration {
    /// The pause after a 429 without `Retry-After`.
    package static var pauseAfterLimit: Duration { .seconds(1) }

    private let clock: C
    private let interval: Duration?
    private var nextSlot: C.Instant
    private var pausedUntil: C.Instant

    package init(perSecond: Double? = nil, clock: C) {
        self.clock = clock
        self.interval = perSecond.map { .nanoseconds(Int64(1e9 / $0)) }
        self.nextSlot = clock.now
        self.pausedUntil = clock.now
    }

    package func admit() async throws {
        while true {
            let now = clock.now
            let at = max(now, pausedUntil, interval == nil ? now : nextSlot)
            guard at > now else { break }
            // A slot is taken before the wait (the actor is re-entered while this call sleeps).
            if let interval { nextSlot = at.advanced(by: interval) }
            try await clock.sleep(until: at, tolerance: nil)
            // A 429 while this call slept moves the pause; otherwise it goes.
            if pausedUntil <= clock.now { return }
        }
        if let interval { nextSlot = max(nextSlot, clock.now).advanced(by: interval) }
    }

    package func limited(retryAfter: Duration?) {
        let until = clock.now.advanced(by: max(retryAfter ?? Self.pauseAfterLimit, .zero))
        if until > pausedUntil { pausedUntil = until }
    }
}

extension ApplePacer where C == ContinuousClock {
    package init(perSecond: Double? = nil) { self.init(perSecond: perSecond, clock: ContinuousClock()) }
}
