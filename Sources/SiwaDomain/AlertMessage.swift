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

    /// What `siwa-events alerts test`'s message says (no rule fires it).
    package static let testSubject = "test alert from siwa-events alerts test: this sink works"

    /// The same facts in words, for a Slack-compatible incoming webhook (`{"text": …}`).
    package func slack(subject: String) -> JSONValue {
        ["text": .string(text(subject: subject))]
    }

    /// One line for people (Slack, logs); `subject` is what the message's rule says of it
    /// (`AlertRule.subject`).
    package func text(subject: String) -> String {
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
