import Foundation
import SiwaDomain
import Testing

/// The spike rule and the alert lifecycle on synthetic traffic, with the clock passed in.
@Suite("Alerting: revocation spikes and the alert lifecycle", .timeLimit(.minutes(10)))
struct AlertingTests {
    /// Revocations per second of one app over `days` days from `start`, with prefix sums for
    /// range counts.
    struct Traffic {
        let start: Date
        var perSecond: [Int]

        init(start: Date, days: Int) {
            self.start = start
            perSecond = Array(repeating: 0, count: days * 86_400)
        }

        /// A realistic day: quiet at night, busy in the afternoon (0.2× to 1.8× of `perMinute`),
        /// with Poisson noise from a fixed seed.
        mutating func daily(perMinute: Double, seed: UInt64) {
            var random = SplitMix64(seed: seed)
            for second in perSecond.indices {
                let hour = Double(second % 86_400) / 3600
                let rate = perMinute / 60 * (1 + 0.8 * sin((hour - 9) / 24 * 2 * .pi))
                perSecond[second] += random.poisson(mean: rate)
            }
        }

        mutating func constant(perSecond rate: Int) {
            for second in perSecond.indices { perSecond[second] += rate }
        }

        /// `count` extra revocations spread evenly over `duration` seconds from `at`.
        mutating func burst(at: Date, count: Int, seconds duration: Int) {
            let first = Int(at.timeIntervalSince(start))
            for k in 0..<count { perSecond[first + k * duration / count] += 1 }
        }

        func prefix() -> [Int] {
            var sums = [0]
            sums.reserveCapacity(perSecond.count + 1)
            for n in perSecond { sums.append(sums.last! + n) }
            return sums
        }
    }

    /// Runs the detector every `interval` over [from, to) for each app and returns what fired and
    /// resolved, in order.
    static func simulate(
        _ apps: [String: Traffic], firstSeen: [String: Date]? = nil, from: Date, to: Date, settings: SpikeSettings = SpikeSettings()
    ) -> [(aud: String, decision: AlertDecision)] {
        var open: [String: AlertEpisode] = [:]
        var events: [(aud: String, decision: AlertDecision)] = []
        let sums = apps.mapValues { $0.prefix() }
        var now = from
        while now < to {
            for (aud, traffic) in apps.sorted(by: { $0.key < $1.key }) {
                let prefix = sums[aud]!
                func count(_ range: Range<Date>) -> Int {
                    let lower = max(0, min(prefix.count - 1, Int(range.lowerBound.timeIntervalSince(traffic.start).rounded(.up))))
                    let upper = max(0, min(prefix.count - 1, Int(range.upperBound.timeIntervalSince(traffic.start).rounded(.up))))
                    return prefix[upper] - prefix[lower]
                }
                let ranges = SpikeRule.ranges(now: now, window: settings.window)
                let baseline = SpikeRule.baseline(
                    dayCounts: ranges.days.map(count), days: ranges.days, firstSeen: firstSeen?[aud] ?? traffic.start, window: settings.window)
                let observation = SpikeRule.observe(count: count(ranges.window), baseline: baseline, settings: settings)
                let key = AlertKey(kind: .revocationSpike, aud: aud, type: RevocationSeries.both)
                let decision = AlertLifecycle.step(open: open[aud], key: key, observation: observation, now: now, resolveAfter: settings.resolveAfter)
                switch decision {
                case .none: break
                case .fire(let episode), .join(let episode, _):
                    open[aud] = episode
                    events.append((aud, decision))
                case .update(let episode): open[aud] = episode
                case .resolve:
                    open[aud] = nil
                    events.append((aud, decision))
                }
            }
            now = now.addingTimeInterval(settings.interval.timeInterval)
        }
        return events
    }

    static let monday = Date(timeIntervalSince1970: 1_767_571_200)  // 2026-01-05 00:00 UTC

    @Test("a week of ordinary daily traffic, then a burst: exactly one alert during the burst, resolved after it")
    func burstAfterAWeek() throws {
        var traffic = Traffic(start: Self.monday, days: 8)
        traffic.daily(perMinute: 2, seed: 42)
        let burstStart = Self.monday.addingTimeInterval(7 * 86_400 + 14 * 3600)
        traffic.burst(at: burstStart, count: 300, seconds: 300)
        let events = Self.simulate(["app"], traffic, from: Self.monday.addingTimeInterval(7 * 86_400), to: Self.monday.addingTimeInterval(8 * 86_400))
        #expect(events.count == 2, "\(events)")
        guard case .fire(let episode) = events.first?.decision, case .resolve(let resolved, let at) = events.last?.decision else {
            Issue.record("expected a firing then a resolution: \(events)")
            return
        }
        #expect(episode.startedAt >= burstStart && episode.startedAt < burstStart.addingTimeInterval(300))
        #expect(resolved.peak >= 300 && resolved.peak < 400)
        let baseline = try #require(resolved.baseline)
        #expect(baseline > 1 && baseline < 30, "an afternoon's 5 minutes at ~2/min × 1.6")
        #expect(try #require(resolved.ratio) >= 5)
        // Normal again once what is left of the burst in the window is under the threshold (after
        // it ended, before it has left the window entirely), then 15 minutes of normal.
        let burstEnd = burstStart.addingTimeInterval(300)
        #expect(at >= burstEnd.addingTimeInterval(15 * 60) && at <= burstEnd.addingTimeInterval(300 + 15 * 60 + 30))
    }

    @Test("an earlier spike at the same hour does not raise the baseline enough to hide the next one (median)")
    func earlierSpikeIgnored() {
        var traffic = Traffic(start: Self.monday, days: 8)
        traffic.daily(perMinute: 2, seed: 7)
        traffic.burst(at: Self.monday.addingTimeInterval(5 * 86_400 + 14 * 3600), count: 5_000, seconds: 300)  // two days earlier: a mean would hide the next
        let burst = Self.monday.addingTimeInterval(7 * 86_400 + 14 * 3600)
        traffic.burst(at: burst, count: 300, seconds: 300)
        let events = Self.simulate(["app"], traffic, from: burst.addingTimeInterval(-3600), to: burst.addingTimeInterval(3600))
        #expect(events.filter { if case .fire = $0.decision { true } else { false } }.count == 1, "\(events)")
    }

    @Test("steady high traffic, however high, never fires")
    func steadyHighTraffic() {
        var traffic = Traffic(start: Self.monday, days: 8)
        traffic.constant(perSecond: 10)
        traffic.daily(perMinute: 60, seed: 3)
        let events = Self.simulate(["app"], traffic, from: Self.monday.addingTimeInterval(7 * 86_400), to: Self.monday.addingTimeInterval(8 * 86_400))
        #expect(events.isEmpty, "\(events)")
    }

    @Test("a new app (under a day of history) is held to the absolute count: 60 in a window fire, 40 do not")
    func newApp() {
        var loud = Traffic(start: Self.monday, days: 1)
        loud.burst(at: Self.monday.addingTimeInterval(3 * 3600), count: 60, seconds: 120)
        var quiet = Traffic(start: Self.monday, days: 1)
        quiet.burst(at: Self.monday.addingTimeInterval(3 * 3600), count: 40, seconds: 120)
        let events = Self.simulate(
            ["loud": loud, "quiet": quiet], from: Self.monday.addingTimeInterval(3600), to: Self.monday.addingTimeInterval(6 * 3600))
        #expect(events.map(\.aud) == ["loud", "loud"], "\(events)")
        #expect(SpikeRule.baseline(dayCounts: [5, 5, 5, 5, 5, 5, 5], days: SpikeRule.ranges(now: Self.monday, window: .seconds(300)).days, firstSeen: nil, window: .seconds(300)) == nil)
    }

    @Test("a burst in one app fires for that app only")
    func perApp() {
        var a = Traffic(start: Self.monday, days: 8)
        a.daily(perMinute: 2, seed: 1)
        var b = Traffic(start: Self.monday, days: 8)
        b.daily(perMinute: 2, seed: 2)
        let burst = Self.monday.addingTimeInterval(7 * 86_400 + 10 * 3600)
        a.burst(at: burst, count: 500, seconds: 300)
        let events = Self.simulate(["a": a, "b": b], from: burst.addingTimeInterval(-1800), to: burst.addingTimeInterval(3 * 3600))
        #expect(events.map(\.aud) == ["a", "a"], "\(events)")
    }

    @Test("lifecycle: one episode per breach, peak kept, a breach during the resolve wait starts it again")
    func lifecycle() {
        let key = AlertKey(kind: .queueLag)
        let t0 = Self.monday
        func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }
        let breach = AlertObservation.atLeast(60, value: 90)
        let fine = AlertObservation.atLeast(60, value: 3)
        guard case .fire(var open) = AlertLifecycle.step(open: nil, key: key, observation: breach, now: t0, resolveAfter: .seconds(100)) else {
            Issue.record("a breach with nothing open fires")
            return
        }
        #expect(AlertLifecycle.step(open: open, key: key, observation: breach, now: at(30), resolveAfter: .seconds(100)) == .none)
        let higher = AlertObservation.atLeast(60, value: 200)
        guard case .update(let peaked) = AlertLifecycle.step(open: open, key: key, observation: higher, now: at(60), resolveAfter: .seconds(100)) else {
            Issue.record("a new peak is recorded")
            return
        }
        #expect(peaked.peak == 200 && peaked.startedAt == t0)
        open = peaked
        guard case .update(let calm) = AlertLifecycle.step(open: open, key: key, observation: fine, now: at(90), resolveAfter: .seconds(100)) else {
            Issue.record("normal again: the wait starts")
            return
        }
        #expect(calm.normalSince == at(90))
        guard case .update(let again) = AlertLifecycle.step(open: calm, key: key, observation: breach, now: at(150), resolveAfter: .seconds(100)) else {
            Issue.record("a breach during the wait")
            return
        }
        #expect(again.normalSince == nil && again.peak == 200)
        guard case .update(let calmAgain) = AlertLifecycle.step(open: again, key: key, observation: fine, now: at(180), resolveAfter: .seconds(100)) else {
            Issue.record("normal again")
            return
        }
        #expect(AlertLifecycle.step(open: calmAgain, key: key, observation: fine, now: at(270), resolveAfter: .seconds(100)) == .none)
        guard case .resolve(let resolved, let when) = AlertLifecycle.step(open: calmAgain, key: key, observation: fine, now: at(280), resolveAfter: .seconds(100)) else {
            Issue.record("resolved after 100 s of normal")
            return
        }
        #expect(when == at(280) && resolved.peak == 200 && resolved.startedAt == t0)
        #expect(AlertLifecycle.step(open: nil, key: key, observation: fine, now: at(300), resolveAfter: .seconds(100)) == .none)
    }

    @Test("episode: one app's series page once — fire naming every crossing series, a told join only for a second type, one resolve")
    func episodeGroupsAnAppsSeries() throws {
        let key = AlertKey(kind: .revocationSpike, aud: "app")
        let t0 = Self.monday
        func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }
        // Thresholds 20, 20 and 40 (the sum has the sum's baseline).
        let baselines = ["consent-revoked": 4.0, "account-delete": 4.0, "revocations": 8.0]
        func step(_ open: AlertEpisode?, _ counts: [String: Int], _ seconds: Double, baselines: [String: Double] = baselines) -> AlertDecision {
            let series = Dictionary(
                uniqueKeysWithValues: counts.map { ($0.key, SpikeRule.observe(count: $0.value, baseline: baselines[$0.key], settings: SpikeSettings())) })
            return AlertLifecycle.step(open: open, key: key, series: series, now: at(seconds), resolveAfter: .seconds(100))
        }
        // Crossing at once, consent-revoked and the sum: one episode naming both.
        guard case .fire(let both) = step(nil, ["consent-revoked": 40, "account-delete": 2, "revocations": 42], 0) else {
            Issue.record("crossing series with nothing open fire")
            return
        }
        #expect(both.key == key && both.series == ["consent-revoked", "revocations"])
        #expect(both.peak == 42 && both.threshold == 40, "the figures follow the crossing series with the largest count")

        // A ramp: consent-revoked crosses first, the sum an evaluation later: recorded, not told.
        guard case .fire(var open) = step(nil, ["consent-revoked": 30, "account-delete": 2, "revocations": 32], 0) else {
            Issue.record("one crossing series fires")
            return
        }
        #expect(open.series == ["consent-revoked"] && open.peak == 30 && open.threshold == 20)
        guard case .update(let ramped) = step(open, ["consent-revoked": 40, "account-delete": 2, "revocations": 42], 30) else {
            Issue.record("the sum following its type is the same burst: recorded silently")
            return
        }
        #expect(ramped.series == ["consent-revoked", "revocations"] && ramped.peak == 42)
        open = ramped
        #expect(step(open, ["consent-revoked": 40, "revocations": 42], 60) == .none, "still crossing, nothing new, no new peak")
        // account-delete crosses too: a second cause, told once.
        guard case .join(let joined, let series) = step(open, ["consent-revoked": 35, "account-delete": 25, "revocations": 60], 90) else {
            Issue.record("a second type crossing during an open episode joins it")
            return
        }
        #expect(series == ["account-delete"])
        #expect(joined.series == RevocationSeries.all && joined.peak == 60 && joined.startedAt == t0)
        open = joined
        #expect(step(open, ["consent-revoked": 35, "account-delete": 25, "revocations": 60], 120) == .none, "named series do not join again")
        // All normal: the wait starts; one crossing series restarts it; all normal for 100 s resolves.
        guard case .update(let calm) = step(open, ["consent-revoked": 3, "revocations": 3], 150) else {
            Issue.record("normal again: the wait starts")
            return
        }
        #expect(calm.normalSince == at(150) && calm.value == 3)
        guard case .update(let again) = step(calm, ["account-delete": 21, "revocations": 21], 200) else {
            Issue.record("a crossing series during the wait restarts it")
            return
        }
        #expect(again.normalSince == nil)
        guard case .update(let calmAgain) = step(again, [:], 210) else {
            Issue.record("no counts at all is normal")
            return
        }
        #expect(step(calmAgain, [:], 300) == .none)
        guard case .resolve(let resolved, let when) = step(calmAgain, [:], 310) else {
            Issue.record("resolved after 100 s of every series normal")
            return
        }
        #expect(when == at(310) && resolved.series == RevocationSeries.all && resolved.peak == 60)

        // Fired on the sum alone (both types up, neither over its own line): a type refining it is
        // recorded silently; the other type then is a second cause, told.
        let sumOnly = ["consent-revoked": 4.0, "account-delete": 4.0, "revocations": 6.0]
        guard case .fire(let wide) = step(nil, ["consent-revoked": 16, "account-delete": 16, "revocations": 32], 0, baselines: sumOnly) else {
            Issue.record("the sum alone fires")
            return
        }
        #expect(wide.series == ["revocations"])
        guard case .update(let refined) = step(wide, ["consent-revoked": 25, "account-delete": 16, "revocations": 41], 30, baselines: sumOnly) else {
            Issue.record("a type refining a sum-only episode is recorded silently")
            return
        }
        #expect(refined.series == ["consent-revoked", "revocations"])
        guard case .join(_, let second) = step(refined, ["consent-revoked": 25, "account-delete": 25, "revocations": 50], 60, baselines: sumOnly) else {
            Issue.record("the other type then joins, told")
            return
        }
        #expect(second == ["account-delete"])
    }

    @Test("episode messages: firing, updated (alert_updated_<n>, naming what joined) and resolved; every series named")
    func episodeMessages() throws {
        let episode = AlertEpisode(
            key: AlertKey(kind: .revocationSpike, aud: "com.example.app"), series: ["consent-revoked", "revocations"], startedAt: Self.monday,
            value: 30, peak: 32, baseline: 4, threshold: 20)
        let sinks = AlertSinks(webhooks: [URL(string: "https://hooks.example.com/a")!], slack: URL(string: "https://slack.example.com/x")!)
        let rule = RevocationSpikeRule()
        let firing = AlertMessage(id: 7, episode: episode, window: .seconds(300), resolvedAt: nil)
        #expect(firing.state == .firing)
        #expect(sinks.messages(firing, subject: rule.subject(firing)).map(\.kind) == ["alert_firing", "alert_firing"])
        #expect(firing.json["series"] == .array([.string("consent-revoked"), .string("revocations")]))
        #expect(firing.json["type"] == .null && firing.json["joined"] == nil)
        #expect(rule.text(firing).hasPrefix("🔴 FIRING [revocation_spike] consent-revoked, revocations (consent-revoked + account-delete) for com.example.app: 32 in 5m"), "\(rule.text(firing))")

        var joined = episode
        joined.series = RevocationSeries.all
        let updated = AlertMessage(id: 7, episode: joined, window: .seconds(300), resolvedAt: nil, joined: ["account-delete"])
        #expect(updated.state == .updated)
        #expect(sinks.messages(updated, subject: rule.subject(updated)).map(\.kind) == ["alert_updated_3", "alert_updated_3"])
        #expect(updated.json["state"] == .string("updated") && updated.json["joined"] == .array([.string("account-delete")]))
        #expect(rule.text(updated).hasPrefix("🟠 UPDATED [revocation_spike] consent-revoked, account-delete, revocations"), "\(rule.text(updated))")
        #expect(rule.text(updated).contains("(account-delete joined)"))

        let resolved = AlertMessage(id: 7, episode: joined, window: .seconds(300), resolvedAt: Self.monday.addingTimeInterval(900))
        #expect(resolved.state == .resolved && sinks.messages(resolved, subject: rule.subject(resolved)).map(\.kind) == ["alert_resolved", "alert_resolved"])

        // An alert stored before episodes (one row per series) names its type as its series.
        let old = AlertEpisode(key: AlertKey(kind: .revocationSpike, aud: "a", type: "account-delete"), startedAt: Self.monday, value: 1, peak: 9, baseline: nil, threshold: 5)
        let oldMessage = AlertMessage(id: 1, episode: old, window: .seconds(300), resolvedAt: nil)
        #expect(oldMessage.series == ["account-delete"] && oldMessage.json["type"] == .string("account-delete"))
        #expect(RevocationSeries.ordered(["revocations", "account-delete", "consent-revoked", "revocations"]) == RevocationSeries.all)
    }

    @Test("a week of traffic of both types, then a consent-revoked burst: one episode for the app (one firing, one resolve), not one per series")
    func burstPagesOnce() {
        var consent = Traffic(start: Self.monday, days: 8)
        consent.daily(perMinute: 2, seed: 11)
        var delete = Traffic(start: Self.monday, days: 8)
        delete.daily(perMinute: 1, seed: 12)
        let burst = Self.monday.addingTimeInterval(7 * 86_400 + 14 * 3600)
        consent.burst(at: burst, count: 300, seconds: 300)
        let settings = SpikeSettings()
        let sums = ["consent-revoked": consent.prefix(), "account-delete": delete.prefix()]
        var open: AlertEpisode?
        var messages: [AlertDecision] = []
        var crossedSeries = Set<String>()
        var now = burst.addingTimeInterval(-3600)
        while now < burst.addingTimeInterval(3 * 3600) {
            let ranges = SpikeRule.ranges(now: now, window: settings.window)
            func count(_ type: String, _ range: Range<Date>) -> Int {
                let prefix = sums[type]!
                let lower = Int(range.lowerBound.timeIntervalSince(Self.monday).rounded(.up))
                let upper = Int(range.upperBound.timeIntervalSince(Self.monday).rounded(.up))
                return prefix[upper] - prefix[lower]
            }
            var series: [String: AlertObservation] = [:]
            for type in RevocationSeries.all {
                let types = type == RevocationSeries.both ? RevocationSeries.types : [type]
                let window = types.map { count($0, ranges.window) }.reduce(0, +)
                let days = ranges.days.map { day in types.map { count($0, day) }.reduce(0, +) }
                let baseline = SpikeRule.baseline(dayCounts: days, days: ranges.days, firstSeen: Self.monday, window: settings.window)
                series[type] = SpikeRule.observe(count: window, baseline: baseline, settings: settings)
                if series[type]!.breaching { crossedSeries.insert(type) }
            }
            let decision = AlertLifecycle.step(
                open: open, key: AlertKey(kind: .revocationSpike, aud: "app"), series: series, now: now, resolveAfter: settings.resolveAfter)
            switch decision {
            case .none: break
            case .update(let episode): open = episode
            case .fire(let episode), .join(let episode, _):
                open = episode
                messages.append(decision)
            case .resolve:
                open = nil
                messages.append(decision)
            }
            now = now.addingTimeInterval(settings.interval.timeInterval)
        }
        #expect(crossedSeries == ["consent-revoked", "revocations"], "the burst crosses two series")
        #expect(messages.count == 2, "one firing and one resolve: \(messages)")
        guard case .fire = messages.first, case .resolve(let resolved, _) = messages.last else {
            Issue.record("expected a firing then a resolution: \(messages)")
            return
        }
        #expect(Set(resolved.series) == crossedSeries)
    }
}

extension AlertingTests {
    static func simulate(
        _ names: [String], _ traffic: Traffic, from: Date, to: Date, settings: SpikeSettings = SpikeSettings()
    ) -> [(aud: String, decision: AlertDecision)] {
        simulate(Dictionary(uniqueKeysWithValues: names.map { ($0, traffic) }), from: from, to: to, settings: settings)
    }
}

/// A small seeded generator, so the synthetic traffic is the same on every run.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Knuth's method: fine for the small means of per-second traffic.
    mutating func poisson(mean: Double) -> Int {
        let limit = exp(-mean)
        var k = 0
        var p = Double.random(in: 0..<1, using: &self)
        while p > limit {
            k += 1
            p *= Double.random(in: 0..<1, using: &self)
        }
        return k
    }
}
