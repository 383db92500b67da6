import Foundation

/// When `transfer_deadline` fires (`SIWA_ALERT_TRANSFER_DAYS`, `SIWA_ALERT_TRANSFER_LAST_DAYS`):
/// at `days` left in Apple's window while users remain, and again at `lastDays`.
package struct TransferDeadlineSettings: Sendable, Equatable {
    package var days = 14
    package var lastDays = 3

    package init() {}
}

/// One app transfer as the deadline rule sees it: its alert key, its window, and how many users
/// still need Apple (sending side: transfer_subs not asked for; receiving side: not exchanged).
package struct TransferBacklog: Sendable, Equatable {
    package var key: AlertKey
    package var window: TransferWindow
    package var usersLeft: Int

    package init(key: AlertKey, window: TransferWindow, usersLeft: Int) {
        self.key = key
        self.window = window
        self.usersLeft = usersLeft
    }
}

/// The `transfer_deadline` rule, pure: one episode per transfer, from the first evaluation at
/// `days` or fewer left with users remaining until none remain or the window closes. At
/// `lastDays` the series `last_days` joins it, which tells the sinks again (`updated`). The
/// episode's value is the users left; its threshold the days crossed. It observes every transfer
/// whose window is open.
package struct TransferDeadlineRule: AlertRule {
    package let kind = AlertKind.transferDeadline
    package var settings: TransferDeadlineSettings

    package init(settings: TransferDeadlineSettings = TransferDeadlineSettings()) {
        self.settings = settings
    }

    /// Each transfer observed or open, in key order.
    package func step(_ backlogs: [TransferBacklog], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let byKey = Dictionary(backlogs.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        let openByKey = Dictionary(open.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        return Set(byKey.keys).union(openByKey.keys).sorted { $0.description < $1.description }.map { key in
            Self.step(open: openByKey[key], key: key, backlog: byKey[key], now: now, settings: settings)
        }
    }

    package func subject(_ message: AlertMessage) -> String {
        let (key, episode) = (message.episode.key, message.episode)
        let transfer = "transfer of \(key.aud ?? "an app") \(key.type ?? "")"
        return switch (message.state, episode.value) {
        case (.resolved, 0): "\(transfer): every user migrated"
        case (.resolved, let left): "\(transfer): Apple's 60-day window closed with \(left) users not migrated"
        case (_, let left):
            "\(transfer): \(left) users not migrated with \(Int(episode.threshold)) days or fewer left in Apple's 60-day window; `siwa-events transfers status`"
        }
    }

    /// The episode's series: `deadline` from the first threshold, `last_days` from the second.
    package static let deadline = "deadline"
    package static let lastDays = "last_days"

    /// A transfer's alert series: the app, and the other team with the direction
    /// (`to TEAMID` when sending, `from TEAMID` when receiving).
    package static func key(aud: String, outgoing: Bool, team: String) -> AlertKey {
        AlertKey(kind: .transferDeadline, aud: aud, type: (outgoing ? "to " : "from ") + team)
    }

    /// One evaluation of one transfer at `now`; `backlog` nil when the transfer is no longer
    /// recorded (or its window long closed).
    package static func step(open: AlertEpisode?, key: AlertKey, backlog: TransferBacklog?, now: Date, settings: TransferDeadlineSettings) -> AlertDecision {
        let left = backlog?.usersLeft ?? open?.value ?? 0
        var crossed: [String] = []
        if let backlog, backlog.usersLeft > 0, backlog.window.isOpen(at: now) {
            let days = backlog.window.daysLeft(at: now)
            if days <= settings.days { crossed.append(deadline) }
            if days <= settings.lastDays { crossed.append(lastDays) }
        }
        let threshold = Double(crossed.contains(lastDays) ? settings.lastDays : settings.days)
        guard var episode = open else {
            guard !crossed.isEmpty else { return .none }
            return .fire(AlertEpisode(key: key, series: crossed, startedAt: now, value: left, peak: left, baseline: nil, threshold: threshold))
        }
        episode.value = left
        episode.peak = max(episode.peak, left)
        guard !crossed.isEmpty else { return .resolve(episode, at: now) }
        let joined = crossed.filter { !episode.series.contains($0) }
        if !joined.isEmpty {
            episode.series += joined
            episode.threshold = threshold
            return .join(episode, series: joined)
        }
        return episode == open ? .none : .update(episode)
    }
}
