import Foundation
import SiwaDomain
import Testing

/// `quiet_app` as a pure function over synthetic histories: arrivals drawn from seeded random
/// processes, the rule stepped every 10 minutes as the monitor would.
@Suite("quiet_app: the rule over synthetic histories", .timeLimit(.minutes(10)))
struct QuietRuleTests {
    static let start = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01T00:00:00Z, a Thursday
    static let day: TimeInterval = 86_400
    static let key = AlertKey(kind: .quietApp, aud: "com.example.app")

    /// Poisson arrivals over `range` at `perHour(t)` (each hour's count drawn, placed uniformly);
    /// `burst` arrivals within two minutes of each event.
    static func arrivals(_ range: Range<Date>, seed: UInt64, burst: Int = 1, perHour: (Date) -> Double) -> [Date] {
        var random = SplitMix64(seed: seed)  // AlertingTests.swift: the same history on every machine
        var result: [Date] = []
        var hour = range.lowerBound
        while hour < range.upperBound {
            for _ in 0..<random.poisson(mean: perHour(hour)) {
                let at = hour.addingTimeInterval(Double.random(in: 0..<3600, using: &random))
                for index in 0..<burst { result.append(at.addingTimeInterval(Double(index) * 120 / Double(burst))) }
            }
            hour = hour.addingTimeInterval(3600)
        }
        return result.filter { range.contains($0) }.sorted()
    }

    /// ~50 a day, twice as many in the afternoon (UTC) as at night.
    static func steady(_ at: Date) -> Double {
        let hour = at.timeIntervalSince1970.truncatingRemainder(dividingBy: day) / 3600
        return 50.0 / 24 * (1 + 0.6 * sin((hour - 9) / 24 * 2 * .pi))
    }

    /// What the monitor would read at `now`: the app's history up to the current hour.
    static func activity(_ arrivals: [Date], now: Date, rejected: [String: Int] = [:]) -> AppActivity? {
        let seen = arrivals.prefix { $0 <= now }
        guard let first = seen.first, let last = seen.last else { return nil }
        let history = QuietRule.history(now: now, firstSeen: first)
        var spans: [Int: Set<Int>] = [:]
        for at in seen where history.contains(at) {
            spans[QuietRule.hourOfWeek(at), default: []].insert(Int(at.timeIntervalSince1970 / QuietRule.span))
        }
        return AppActivity(
            aud: key.aud!, firstSeen: first, lastArrival: last, history: history, activeSpans: spans.mapValues(\.count), rejectedSince: rejected)
    }

    /// Steps the rule every 10 minutes over `range`: when it fired, and when it resolved.
    static func run(_ arrivals: [Date], over range: Range<Date>, settings: QuietSettings = QuietSettings()) -> (fired: [Date], resolved: [Date]) {
        var open: AlertEpisode?
        var (fired, resolved): ([Date], [Date]) = ([], [])
        var now = range.lowerBound
        while now < range.upperBound {
            defer { now = now.addingTimeInterval(QuietRule.span) }
            let last = arrivals.last { $0 <= now }
            if open == nil, let last, now.timeIntervalSince(last) < settings.minimumGap.timeInterval { continue }
            switch QuietRule.step(open: open, key: key, activity: activity(arrivals, now: now), now: now, settings: settings) {
            case .fire(let episode): (open, fired) = (episode, fired + [now])
            case .update(let episode): open = episode
            case .resolve: (open, resolved) = (nil, resolved + [now])
            case .none, .join: break
            }
        }
        return (fired, resolved)
    }

    @Test(
        "steady, weekly and bursty apps: no false alarm over a simulated month each, for 3 seeds (expected under the model: 1,500 gaps a month at 1 in 100,000, about 0.015 for the steady app)"
    )
    func noFalseAlarms() {
        let month = Self.start.addingTimeInterval(35 * Self.day)..<Self.start.addingTimeInterval(65 * Self.day)
        for seed: UInt64 in [1, 2, 3] {
            let steady = Self.arrivals(Self.start..<month.upperBound, seed: seed, perHour: Self.steady)
            #expect(steady.count > 2_800, "about 50 a day for 65 days: \(steady.count)")
            #expect(Self.run(steady, over: month).fired.isEmpty, "steady app, seed \(seed)")
            let weekly = Self.arrivals(Self.start..<month.upperBound, seed: seed) { _ in 1.0 / 168 }
            #expect(Self.run(weekly, over: month).fired.isEmpty, "weekly app, seed \(seed): \(weekly.count) arrivals")
            // Five bursts of ten a day: fifty a day, in few spans.
            let bursty = Self.arrivals(Self.start..<month.upperBound, seed: seed, burst: 10) { _ in 5.0 / 24 }
            #expect(Self.run(bursty, over: month).fired.isEmpty, "bursty app, seed \(seed)")
        }
    }

    @Test("a steady app of ~50 a day that stops fires once within 6 hours, never before the 1-hour floor, and resolves at its next arrival")
    func steadyStops() throws {
        let stop = Self.start.addingTimeInterval(40 * Self.day + 12 * 3600)  // noon
        var arrivals = Self.arrivals(Self.start..<stop, seed: 7, perHour: Self.steady)
        let last = try #require(arrivals.last)
        let back = stop.addingTimeInterval(10 * 3600)
        arrivals.append(back)
        let (fired, resolved) = Self.run(arrivals, over: last..<stop.addingTimeInterval(12 * 3600))
        #expect(fired.count == 1, "\(fired)")
        let after = (fired.first ?? .distantFuture).timeIntervalSince(last)
        #expect(after >= 3600 && after <= 6 * 3600, "fired \(after / 3600) h after the last arrival")
        #expect(resolved.count == 1 && (resolved.first ?? .distantPast) >= back, "\(resolved)")
        // The episode starts at the last arrival and counts the minutes since.
        if case .fire(let episode) = QuietRule.step(
            open: nil, key: Self.key, activity: Self.activity(arrivals, now: fired[0]), now: fired[0], settings: QuietSettings())
        {
            #expect(episode.startedAt == last && episode.value == Int(fired[0].timeIntervalSince(last) / 60))
            #expect((episode.baseline ?? 0) > 5, "spans with an arrival usually seen in that time: \(episode.baseline ?? 0)")
        } else {
            Issue.record("expected a firing at \(fired[0])")
        }
    }

    @Test("a weekly app is not paged after a quiet day, nor a bursty one after a day without bursts")
    func sparseApps() {
        let now = Self.start.addingTimeInterval(40 * Self.day)
        let weekly = Self.arrivals(Self.start..<now.addingTimeInterval(-Self.day), seed: 11) { _ in 1.0 / 168 }
        #expect(Self.run(weekly, over: now.addingTimeInterval(-Self.day)..<now).fired.isEmpty)
        let bursty = Self.arrivals(Self.start..<now.addingTimeInterval(-Self.day), seed: 11, burst: 10) { _ in 5.0 / 24 }
        #expect(Self.run(bursty, over: now.addingTimeInterval(-Self.day)..<now).fired.isEmpty)
    }

    @Test("a brand-new app has no baseline: silent until it has 7 days of history, then quiet like any other")
    func brandNew() {
        let first = Self.start
        let arrivals = Self.arrivals(first..<first.addingTimeInterval(3 * Self.day), seed: 5, perHour: Self.steady)
        let (fired, _) = Self.run(arrivals, over: first..<first.addingTimeInterval(8 * Self.day))
        #expect(fired.count == 1, "\(fired)")
        #expect((fired.first ?? .distantPast) >= first.addingTimeInterval(7 * Self.day), "fired before 7 days of history: \(fired)")
    }

    @Test("an app whose notifications all arrive as wrong_audience is quiet: the alert names the reason and `rejections list`")
    func wrongAudience() throws {
        let stop = Self.start.addingTimeInterval(30 * Self.day)
        let arrivals = Self.arrivals(Self.start..<stop, seed: 3, perHour: Self.steady)
        let now = try #require(Self.run(arrivals, over: stop..<stop.addingTimeInterval(Self.day)).fired.first)
        let hours = Int(now.timeIntervalSince(arrivals.last ?? now) / 3600)
        let activity = try #require(Self.activity(arrivals, now: now, rejected: ["wrong_audience": 40, "bad_signature": 0]))
        guard case .fire(let episode) = QuietRule.step(open: nil, key: Self.key, activity: activity, now: now, settings: QuietSettings()) else {
            Issue.record("expected a firing")
            return
        }
        #expect(episode.series == ["wrong_audience"])
        let text = QuietRule().text(AlertMessage(id: 4, episode: episode, window: .seconds(300), resolvedAt: nil))
        #expect(text.contains("[quiet_app] nothing has arrived for com.example.app for \(hours) h"), "\(text)")
        #expect(text.contains("rejected meanwhile (wrong_audience): `siwa-events rejections list`"), "\(text)")
        #expect(text.contains("under 1 in 100,000"), "\(text)")
        let json = AlertMessage(id: 4, episode: episode, window: .seconds(300), resolvedAt: nil).json
        #expect(json["ratio"] == .null && json["threshold"] == .number(100_000))
    }

    @Test("hours of the week count from Monday 00:00 UTC")
    func hourOfWeek() {
        #expect(QuietRule.hourOfWeek(Self.start) == 72, "2026-01-01 is a Thursday")
        #expect(QuietRule.hourOfWeek(Date(timeIntervalSince1970: 1_767_571_200 + 3600 * 5)) == 5, "2026-01-05 05:00 is a Monday")
    }
}
