/// Capped exponential backoff with jitter: attempt n waits between half and all of
/// min(cap, base · 2^(n-1)), so retries of a failing batch spread out instead of arriving together.
package struct RetryBackoff: Sendable {
    package var base: Duration
    package var cap: Duration

    package init(base: Duration = .seconds(1), cap: Duration = .seconds(3600)) {
        self.base = base
        self.cap = cap
    }

    /// `unit` is a random number in 0..<1 (passed in: rules never read randomness or clocks).
    package func delay(attempt: Int, unit: Double) -> Duration {
        let exponent = min(max(attempt - 1, 0), 30)
        let raw = base.timeInterval * Double(1 << exponent)
        let capped = min(raw, cap.timeInterval)
        return .milliseconds(Int64((capped * (0.5 + 0.5 * min(max(unit, 0), 1))) * 1000))
    }
}
