import Foundation

/// What the sinks receive about an alert: one `firing` message per episode, one `updated` each
/// time another series joins it, and one `resolved`.
package struct AlertMessage: Sendable, Equatable {
    /// Which message of the episode this is.
    package enum State: String, Sendable {
        case firing, updated, resolved
    }

    package var id: Int
    package var episode: AlertEpisode
    package var window: Duration
    package var resolvedAt: Date?
    /// The series that joined the episode with this message (non-empty only for `updated`).
    package var joined: [String]

    package init(id: Int, episode: AlertEpisode, window: Duration, resolvedAt: Date?, joined: [String] = []) {
        self.id = id
        self.episode = episode
        self.window = window
        self.resolvedAt = resolvedAt
        self.joined = joined
    }

    package var state: State { resolvedAt != nil ? .resolved : joined.isEmpty ? .firing : .updated }

    /// The series the message names: the episode's, or an old per-series alert's type.
    package var series: [String] { episode.series.isEmpty ? episode.key.type.map { [$0] } ?? [] : episode.series }

    /// The webhook body: `{"id","kind","state","aud","type","series","window","count","baseline",
    /// "ratio","threshold","started_at","resolved_at"}` (plus `joined` when `updated`); window in
    /// seconds, count the episode's peak. `type` is null for an episode (its series are listed).
    /// quiet_app: count is the minutes without an arrival, baseline the 10-minute spans that
    /// usually have one in that time, threshold the odds, series the rejection reasons meanwhile.
    package var json: JSONValue {
        var object: [String: JSONValue] = [
            "id": .number(Double(id)), "kind": .string(episode.key.kind.rawValue), "state": .string(state.rawValue),
            "aud": episode.key.aud.map(JSONValue.string) ?? .null, "type": episode.key.type.map(JSONValue.string) ?? .null,
            "series": .array(series.map(JSONValue.string)),
            "window": .number(window.timeInterval.rounded()), "count": .number(Double(episode.peak)),
            "baseline": episode.baseline.map { .number(($0 * 100).rounded() / 100) } ?? .null,
            "ratio": episode.key.kind == .quietApp ? .null : episode.ratio.map { .number(($0 * 100).rounded() / 100) } ?? .null,
            "threshold": .number((episode.threshold * 100).rounded() / 100),
            "started_at": .string(iso8601(episode.startedAt)), "resolved_at": resolvedAt.map { .string(iso8601($0)) } ?? .null,
        ]
        if state == .updated { object["joined"] = .array(joined.map(JSONValue.string)) }
        return .object(object)
    }

    /// What to run for a lane's discarded jobs, once their cause is fixed.
    static func discardedHint(lane: String) -> String {
        switch lane {
        case "effects": ": fix the cause, then `siwa-events jobs retry --discarded`"
        case "callbacks": ": see `siwa-events callbacks list --failed`, then `siwa-events callbacks redeliver`"
        case "apple_revocations":
            ": their tokens are kept, unrevoked, until Apple takes them: see `siwa-events apple revocations --failed`, then `siwa-events apple retry --discarded`"
        default: ""
        }
    }

    /// "6 h 10 m" for 370 minutes.
    static func minutes(_ minutes: Int) -> String {
        minutes < 60 ? "\(minutes) m" : minutes % 60 == 0 ? "\(minutes / 60) h" : "\(minutes / 60) h \(minutes % 60) m"
    }

    /// The same facts in words, for a Slack-compatible incoming webhook (`{"text": …}`).
    package var slack: JSONValue {
        ["text": .string(text)]
    }

    /// What the alert says, without its state, series joined, times or id.
    package var subject: String {
        let key = episode.key
        let window = DurationSyntax.format(self.window)
        switch key.kind {
        case .revocationSpike:
            let what = series.isEmpty ? "revocations" : series.map(RevocationSeries.describe).joined(separator: ", ")
            let versus = episode.baseline.map { String(format: "usually %.1f", $0) } ?? "no history yet"
            let ratio = episode.ratio.map { String(format: ", %.1f×", $0) } ?? ""
            return "\(what) for \(key.aud ?? "every app"): \(episode.peak) in \(window) (\(versus)\(ratio))"
        case .jobsDiscarded:
            guard let lane = key.type else { return "\(episode.peak) jobs discarded after their last attempt in \(window)" }
            return "\(episode.peak) \(lane) jobs discarded after their last attempt in \(window)" + Self.discardedHint(lane: lane)
        case .queueLag:
            return "the oldest ready job waited \(episode.peak) s (threshold \(Int(episode.threshold)) s)"
        case .badSignatures:
            return "\(episode.peak) deliveries with a bad signature in \(window)"
        case .appleCredentials:
            return "Apple refused our client secret (invalid_client) \(episode.peak) times in \(window): check SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and the .p8"
        case .transferDeadline:
            let transfer = "transfer of \(key.aud ?? "an app") \(key.type ?? "")"
            return switch (state, episode.value) {
            case (.resolved, 0): "\(transfer): every user migrated"
            case (.resolved, let left): "\(transfer): Apple's 60-day window closed with \(left) users not migrated"
            case (_, let left):
                "\(transfer): \(left) users not migrated with \(Int(episode.threshold)) days or fewer left in Apple's 60-day window; `siwa-events transfers status`"
            }
        case .quietApp:
            let digits = String(Int(episode.threshold))
            let odds = digits.enumerated().map { index, digit in (index > 0 && (digits.count - index) % 3 == 0 ? "," : "") + String(digit) }.joined()
            let rejected = series.isEmpty ? "" : "; deliveries were rejected meanwhile (\(series.joined(separator: ", "))): `siwa-events rejections list`"
            return "nothing has arrived for \(key.aud ?? "an app") for \(Self.minutes(episode.peak)); its history has arrivals in "
                + "about \(Int((episode.baseline ?? 0).rounded())) of that time's 10-minute spans (chance of such a gap under 1 in \(odds))\(rejected)"
        case .endpointUnhealthy:
            return key.type == EndpointHealthRule.certificate
                ? "the certificate of the endpoint registered with Apple expires in \(episode.value) days (threshold \(Int(episode.threshold))): renew it"
                : "the endpoint registered with Apple fails its \(key.type ?? "") check: see /health on the admin listener, or run siwa-events doctor"
        case .test:
            return "test alert from siwa-events alerts test: this sink works"
        }
    }

    /// One line for people (Slack, logs).
    package var text: String {
        let key = episode.key
        let prefix = switch state {
        case .firing: "🔴 FIRING"
        case .updated: "🟠 UPDATED"
        case .resolved: "✅ RESOLVED"
        }
        let joinedNow = joined.isEmpty ? "" : " (\(joined.joined(separator: ", ")) joined)"
        let since = "since \(iso8601(episode.startedAt))" + (resolvedAt.map { ", resolved \(iso8601($0))" } ?? "")
        return "\(prefix) [\(key.kind.rawValue)] \(subject)\(joinedNow); \(since) (alert \(id))"
    }
}
