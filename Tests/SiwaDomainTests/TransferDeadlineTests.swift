import Foundation
import SiwaDomain
import Testing

@Suite("transfer_deadline: the rule over a transfer's days left and users left", .timeLimit(.minutes(10)))
struct TransferDeadlineTests {
    static let transferred = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01T00:00:00Z
    static let key = TransferDeadlineRule.key(aud: "com.example.app", outgoing: true, team: "TEAMB23456")
    static let settings = TransferDeadlineSettings()  // 14 days, then 3

    /// The backlog with `daysLeft` days left, the day under way counted (a minute into that day).
    static func backlog(daysLeft: Double, users: Int) -> (TransferBacklog, Date) {
        let window = TransferWindow(transferredAt: transferred)
        return (TransferBacklog(key: key, window: window, usersLeft: users), window.closesAt.addingTimeInterval(-daysLeft * 86_400 + 60))
    }

    /// Steps one transfer through `days` (days left, users left) from nothing open; the kinds of decision taken.
    static func run(_ days: [(Double, Int?)]) -> [String] {
        var open: AlertEpisode?
        var taken: [String] = []
        for (daysLeft, users) in days {
            let (backlog, now) = backlog(daysLeft: daysLeft, users: users ?? 0)
            switch TransferDeadlineRule.step(open: open, key: key, backlog: users == nil ? nil : backlog, now: now, settings: settings) {
            case .none: break
            case .fire(let episode): (open, taken) = (episode, taken + ["fire \(episode.value) \(Int(episode.threshold))"])
            case .update(let episode): open = episode
            case .join(let episode, let series): (open, taken) = (episode, taken + ["join \(series.joined()) \(episode.value) \(Int(episode.threshold))"])
            case .resolve(let episode, _): (open, taken) = (nil, taken + ["resolve \(episode.value)"])
            }
        }
        return taken
    }

    @Test("a transfer with users left fires once at 14 days left, joins last_days at 3, and resolves when none is left")
    func lifecycle() {
        let days: [(Double, Int?)] = [(30, 100), (15, 100), (14, 100), (13, 90), (10, 50), (3, 20), (2, 10), (2, 0), (1, 0)]
        #expect(Self.run(days) == ["fire 100 14", "join last_days 20 3", "resolve 0"])
    }

    @Test("first seen in the last days, it fires once naming both; the window closing with users left resolves it")
    func lateAndClosed() {
        let (backlog, now) = Self.backlog(daysLeft: 2, users: 7)
        guard case .fire(let episode) = TransferDeadlineRule.step(open: nil, key: Self.key, backlog: backlog, now: now, settings: Self.settings) else {
            Issue.record("expected a firing")
            return
        }
        #expect(episode.series == ["deadline", "last_days"] && episode.threshold == 3 && episode.value == 7)
        #expect(Self.run([(2, 7), (1, 7), (-1, 7)]) == ["fire 7 3", "resolve 7"], "closed: nothing more Apple will do")
        #expect(Self.run([(10, 7), (5, nil)]) == ["fire 7 14", "resolve 7"], "the transfer gone: resolved with the last count")
    }

    @Test("no users left, or days to spare: nothing fires")
    func quiet() {
        #expect(Self.run([(20, 100), (14, 0), (3, 0), (1, 0)]).isEmpty)
        #expect(Self.run([(59, 100), (15, 100)]).isEmpty)
    }

    @Test("the message names the transfer, the users left and the days; resolved says why")
    func message() {
        var episode = AlertEpisode(key: Self.key, series: ["deadline"], startedAt: Self.transferred, value: 40, peak: 40, baseline: nil, threshold: 14)
        let firing = TransferDeadlineRule().text(AlertMessage(id: 9, episode: episode, window: .seconds(300), resolvedAt: nil))
        #expect(firing.contains("[transfer_deadline] transfer of com.example.app to TEAMB23456: 40 users not migrated with 14 days or fewer left"), "\(firing)")
        episode.value = 0
        #expect(TransferDeadlineRule().text(AlertMessage(id: 9, episode: episode, window: .seconds(300), resolvedAt: Self.transferred)).contains("every user migrated"))
        episode.value = 3
        #expect(TransferDeadlineRule().text(AlertMessage(id: 9, episode: episode, window: .seconds(300), resolvedAt: Self.transferred)).contains("closed with 3 users not migrated"))
    }
}
