import SiwaDomain
import Testing

/// The retry schedule of failing jobs and callbacks (SIWA_JOB_MAX_ATTEMPTS' waits).
@Suite("Retry backoff: capped exponential with jitter", .timeLimit(.minutes(10)))
struct RetryBackoffTests {
    let backoff = RetryBackoff(base: .seconds(1), cap: .seconds(3600))

    @Test("attempt n waits between half and all of base·2^(n-1): 0.5–1 s, 1–2 s, 2–4 s, …")
    func bounds() {
        for attempt in 1...10 {
            let full = Double(1 << (attempt - 1))
            #expect(backoff.delay(attempt: attempt, unit: 0).timeInterval == full / 2, "attempt \(attempt), least jitter")
            #expect(backoff.delay(attempt: attempt, unit: 0.999_999).timeInterval.rounded() == full, "attempt \(attempt), most jitter")
        }
    }

    @Test("the wait never exceeds the cap, even at attempt 1000 (no overflow), and never goes below half of it once capped")
    func cap() {
        for attempt in [13, 14, 31, 64, 1000, Int.max] {
            let most = backoff.delay(attempt: attempt, unit: 0.999_999).timeInterval
            let least = backoff.delay(attempt: attempt, unit: 0).timeInterval
            #expect(most <= 3600 && most > 3599, "attempt \(attempt): \(most)")
            #expect(least == 1800, "attempt \(attempt): \(least)")
        }
        #expect(backoff.delay(attempt: 0, unit: 0).timeInterval == 0.5, "attempt 0 counts as the first")
        #expect(backoff.delay(attempt: -3, unit: 1).timeInterval == 1)
    }

    @Test("jitter spreads one attempt's waits over its whole band: retries of a batch do not arrive together")
    func jitter() {
        let waits = (0..<100).map { backoff.delay(attempt: 5, unit: Double($0) / 100).timeInterval }
        #expect(Set(waits).count == 100)
        #expect(waits.min()! >= 8 && waits.max()! < 16)
        // Out-of-range randomness is clamped, not trusted.
        #expect(backoff.delay(attempt: 5, unit: -1).timeInterval == 8 && backoff.delay(attempt: 5, unit: 7).timeInterval == 16)
    }
}
