import Crypto
import Foundation

/// What the built-in alerting watches.
package enum AlertKind: String, Sendable, CaseIterable, Codable {
    /// consent-revoked and/or account-delete notifications far above their usual rate.
    case revocationSpike = "revocation_spike"
    /// Effect or delivery jobs that ran out of attempts.
    case jobsDiscarded = "jobs_discarded"
    /// The oldest ready job has waited longer than the threshold.
    case queueLag = "queue_lag"
    /// Deliveries refused because their RS256 signature did not verify.
    case badSignatures = "bad_signatures"
    /// Apple refused our client secret (`invalid_client`): calls to `/auth/token` and
    /// `/auth/revoke` all fail until the credentials are fixed.
    case appleCredentials = "apple_credentials"
    /// An app transfer's 60-day window is running out with users not yet migrated
    /// (`TransferDeadlineRule`).
    case transferDeadline = "transfer_deadline"
    /// Nothing has arrived for an app for far longer than its own history makes likely.
    case quietApp = "quiet_app"
    /// The public endpoint registered with Apple (`SIWA_PUBLIC_URL`) fails the doctor's checks,
    /// or its certificate expires soon.
    case endpointUnhealthy = "endpoint_unhealthy"
    /// `siwa-events alerts test`: checks every sink, never fires by itself.
    case test
}

/// One alert series: a kind, and for a revocation spike the app (`aud`) and the revocation type
/// (`consent-revoked`, `account-delete`, or `revocations` for both together).
///
/// It also names an episode: an operational alert's episode is its series; a revocation spike's
/// is the app's (`type` nil), grouping the app's three series so one burst pages once. Alerts
/// stored before episodes (one row per series) keep their `type` until they resolve.
package struct AlertKey: Hashable, Sendable, CustomStringConvertible {
    package var kind: AlertKind
    package var aud: String?
    package var type: String?

    package init(kind: AlertKind, aud: String? = nil, type: String? = nil) {
        self.kind = kind
        self.aud = aud
        self.type = type
    }

    package var description: String { [kind.rawValue, aud, type].compactMap { $0 }.joined(separator: "/") }
}

/// The revocation types a spike is watched for, each alone and both together.
package enum RevocationSeries {
    package static let types = [EventType.consentRevoked.rawValue, EventType.accountDelete.rawValue]
    package static let both = "revocations"
    /// Every series of one app's episode, in the order messages name them.
    package static let all = types + [both]

    /// `names` without duplicates, in the order of `all` (unknown names last, sorted).
    package static func ordered(_ names: some Sequence<String>) -> [String] {
        Set(names).sorted { (all.firstIndex(of: $0) ?? all.count, $0) < (all.firstIndex(of: $1) ?? all.count, $1) }
    }

    /// How messages name a series.
    package static func describe(_ name: String) -> String {
        name == both ? "revocations (consent-revoked + account-delete)" : name
    }
}

/// The spike rule's settings (`SIWA_SPIKE_*`).
package struct SpikeSettings: Sendable, Equatable {
    /// How often the detector evaluates.
    package var interval: Duration = .seconds(30)
    /// The window whose count is compared with the baseline.
    package var window: Duration = .seconds(300)
    /// A spike needs at least this many revocations in the window…
    package var minCount = 20
    /// …and at least this many times the baseline.
    package var factor = 5.0
    /// With no history for the app (less than a day), this many in the window fire on their own.
    package var newAppCount = 50
    /// A firing alert resolves once its series has been normal this long.
    package var resolveAfter: Duration = .seconds(900)

    package init() {}
}

/// Revocation spikes: the baseline is seasonal (the same time of day) and robust (a median).
///
/// For each of the 7 days before `now`, take the count in the hour centred on this time of day
/// (an hour rather than the window itself, so a quiet 5 minutes on one day is not a baseline of
/// zero), scale it to the window's length, and take the **median** over the days the app has
/// history for. A spike on one, two or three of those days leaves the median where it was; daily
/// and weekly rhythms are followed because each day is compared at the same hour. An app with no
/// history a day back (a new app) has no baseline and is held to an absolute count instead.
package enum SpikeRule {
    package static let historyDays = 7
    package static let neighbourhood: TimeInterval = 3600

    /// The ranges whose counts the rule needs at `now`: the window ending now, and the hour
    /// centred on this time of day on each of the 7 previous days (most recent first).
    package static func ranges(now: Date, window: Duration) -> (window: Range<Date>, days: [Range<Date>]) {
        let windowRange = now.addingTimeInterval(-window.timeInterval)..<now
        let days = (1...historyDays).map { day -> Range<Date> in
            let centre = now.addingTimeInterval(-Double(day) * 86_400 - window.timeInterval / 2)
            return centre.addingTimeInterval(-neighbourhood / 2)..<centre.addingTimeInterval(neighbourhood / 2)
        }
        return (windowRange, days)
    }

    /// The expected count in one window: the median over the days with history of that day's
    /// hour count scaled to the window. nil when no day has history (`firstSeen` after each
    /// day's hour began, or unknown): a new app.
    package static func baseline(dayCounts: [Int], days: [Range<Date>], firstSeen: Date?, window: Duration) -> Double? {
        guard let firstSeen else { return nil }
        let scale = window.timeInterval / neighbourhood
        let known = zip(dayCounts, days).filter { $0.1.lowerBound >= firstSeen }.map { Double($0.0) * scale }.sorted()
        guard !known.isEmpty else { return nil }
        let middle = known.count / 2
        return known.count % 2 == 1 ? known[middle] : (known[middle - 1] + known[middle]) / 2
    }

    /// Whether `count` in the window is a spike against `baseline` (nil: a new app).
    package static func observe(count: Int, baseline: Double?, settings: SpikeSettings) -> AlertObservation {
        guard let baseline else {
            return AlertObservation(value: count, baseline: nil, threshold: Double(settings.newAppCount), breaching: count >= settings.newAppCount)
        }
        let threshold = max(Double(settings.minCount), settings.factor * baseline)
        return AlertObservation(value: count, baseline: baseline, threshold: threshold, breaching: Double(count) >= threshold)
    }
}

/// One evaluation of one series: its value (a count, or seconds of lag), what it was compared
/// with, and whether it is over the line.
package struct AlertObservation: Sendable, Equatable {
    package var value: Int
    package var baseline: Double?
    package var threshold: Double
    package var breaching: Bool

    package init(value: Int, baseline: Double?, threshold: Double, breaching: Bool) {
        self.value = value
        self.baseline = baseline
        self.threshold = threshold
        self.breaching = breaching
    }

    /// A plain threshold: breaching at `threshold` or more (operational alerts).
    package static func atLeast(_ threshold: Int, value: Int) -> AlertObservation {
        AlertObservation(value: value, baseline: nil, threshold: Double(threshold), breaching: value >= threshold)
    }

    /// value ÷ baseline, when there is a baseline above zero.
    package var ratio: Double? { baseline.flatMap { $0 > 0 ? Double(value) / $0 : nil } }
}

/// A firing alert: one per episode, from the first breaching evaluation until the series has
/// been normal for the resolve delay. A revocation episode covers one app's series: its figures
/// are those of the crossing series with the largest count, and `series` names each that crossed.
package struct AlertEpisode: Sendable, Equatable {
    package var key: AlertKey
    /// The series that crossed during the episode (`RevocationSeries.all` order); empty for
    /// operational kinds, the one type for an alert stored before episodes.
    package var series: [String]
    package var startedAt: Date
    /// The latest evaluation's value.
    package var value: Int
    /// The largest value of the episode, with the baseline and threshold it was compared with.
    package var peak: Int
    package var baseline: Double?
    package var threshold: Double
    /// Since when the series has been back to normal (nil while breaching).
    package var normalSince: Date?

    package init(
        key: AlertKey, series: [String] = [], startedAt: Date, value: Int, peak: Int, baseline: Double?, threshold: Double, normalSince: Date? = nil
    ) {
        self.key = key
        self.series = series
        self.startedAt = startedAt
        self.value = value
        self.peak = peak
        self.baseline = baseline
        self.threshold = threshold
        self.normalSince = normalSince
    }

    /// peak ÷ baseline, when there is a baseline above zero.
    package var ratio: Double? { baseline.flatMap { $0 > 0 ? Double(peak) / $0 : nil } }
}

/// What one evaluation does to a series.
package enum AlertDecision: Sendable, Equatable {
    /// Nothing open and nothing breaching, or nothing worth writing.
    case none
    /// A new episode: record it and tell the sinks.
    case fire(AlertEpisode)
    /// The open episode's figures changed (a new peak, normal since…): record, tell nobody.
    case update(AlertEpisode)
    /// A revocation type crossed while the app's episode already names the other: a second cause,
    /// so record it and tell the sinks (an `updated` message naming the series that joined).
    case join(AlertEpisode, series: [String])
    /// Normal for the resolve delay: close the episode and tell the sinks.
    case resolve(AlertEpisode, at: Date)
}

extension AlertDecision {
    /// The episode the decision is about (nil for `none`).
    package var episode: AlertEpisode? {
        switch self {
        case .none: nil
        case .fire(let episode), .update(let episode), .join(let episode, _), .resolve(let episode, _): episode
        }
    }
}

/// The alert lifecycle, pure: `firing` at the first breaching evaluation, one episode however
/// long it lasts, `resolved` after `resolveAfter` of normal evaluations (a breach in between
/// starts the wait again).
package enum AlertLifecycle {
    package static func step(
        open: AlertEpisode?, key: AlertKey, observation: AlertObservation, now: Date, resolveAfter: Duration
    ) -> AlertDecision {
        guard var episode = open else {
            guard observation.breaching else { return .none }
            return .fire(
                AlertEpisode(
                    key: key, startedAt: now, value: observation.value, peak: observation.value, baseline: observation.baseline,
                    threshold: observation.threshold))
        }
        let before = episode
        episode.value = observation.value
        if observation.breaching {
            episode.normalSince = nil
            if observation.value > episode.peak {
                episode.peak = observation.value
                episode.baseline = observation.baseline
                episode.threshold = observation.threshold
            }
        } else {
            let since = episode.normalSince ?? now
            if now.timeIntervalSince(since) >= resolveAfter.timeInterval { return .resolve(episode, at: now) }
            episode.normalSince = since
        }
        return episode == before ? .none : .update(episode)
    }

    /// One app's revocation episode, over its series (`consent-revoked`, `account-delete`,
    /// `revocations`): it fires when any crosses, naming every one that did, and resolves once all
    /// have been normal for `resolveAfter`. A series crossing later joins it: told (`join`) when it
    /// is a revocation type and the episode already names the other type — a second cause; else
    /// recorded silently (`update`), being the same burst seen again: `revocations` (the sum)
    /// following a type, or a type refining an episode that fired on `revocations` alone. The
    /// figures follow the crossing series with the largest count (with none crossing, the value is
    /// the largest count). A series absent from `series` counts as normal.
    package static func step(
        open: AlertEpisode?, key: AlertKey, series: [String: AlertObservation], now: Date, resolveAfter: Duration
    ) -> AlertDecision {
        let crossed = RevocationSeries.ordered(series.filter(\.value.breaching).keys)
        let headline =
            crossed.compactMap { series[$0] }.max { $0.value < $1.value }
            ?? AlertObservation(value: series.values.map(\.value).max() ?? 0, baseline: nil, threshold: open?.threshold ?? 0, breaching: false)
        let decision = step(open: open, key: key, observation: headline, now: now, resolveAfter: resolveAfter)
        switch decision {
        case .fire(var episode):
            episode.series = crossed
            return .fire(episode)
        case .none, .update:
            guard let open else { return decision }
            let joined = crossed.filter { !open.series.contains($0) }
            guard !joined.isEmpty else { return decision }
            var episode = open
            if case .update(let updated) = decision { episode = updated }
            episode.series = RevocationSeries.ordered(open.series + joined)
            let isType = { RevocationSeries.types.contains($0) }
            return joined.contains(where: isType) && open.series.contains(where: isType) ? .join(episode, series: joined) : .update(episode)
        case .join, .resolve:
            return decision
        }
    }
}

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

/// Where alerts go besides the log: webhooks (`SIWA_ALERT_WEBHOOK_URLS`, signed like callbacks)
/// and a Slack-compatible incoming webhook (`SIWA_ALERT_SLACK_URL`). A job names its sink by a
/// hash, never by URL (Slack URLs are secrets): `webhook:<16 hex>` or `slack`.
package struct AlertSinks: Sendable {
    package var webhooks: [URL]
    package var slack: URL?
    /// Signs webhook messages (`SIWA_ALERT_SECRET`); required with webhooks.
    package var signer: WebhookSigner?
    package var timeout: Duration = .seconds(10)

    package init(webhooks: [URL] = [], slack: URL? = nil, signer: WebhookSigner? = nil) {
        self.webhooks = webhooks
        self.slack = slack
        self.signer = signer
    }

    package var isEmpty: Bool { webhooks.isEmpty && slack == nil }

    package static func target(webhook url: URL) -> String {
        "webhook:" + SHA256.hash(data: Data(url.absoluteString.utf8)).prefix(8).map { String(format: "%02x", $0) }.joined()
    }

    /// One message per sink: the JSON body to webhooks, the text to Slack. The kind names the
    /// message within its alert (the webhook-id is `alert_<id>_<kind without alert_>`), so each
    /// update has its own: `alert_updated_<n>`, n the number of series the episode names after it
    /// (series only join, so n grows with each update).
    package func messages(_ message: AlertMessage) -> [SinkMessage] {
        let kind = switch (message.episode.key.kind, message.state) {
        case (.test, _): "alert_test"
        case (_, .updated): "alert_updated_\(message.series.count)"
        case (_, let state): "alert_\(state.rawValue)"
        }
        return webhooks.map { SinkMessage(target: Self.target(webhook: $0), kind: kind, body: message.json.jsonText) }
            + (slack == nil ? [] : [SinkMessage(target: "slack", kind: kind, body: message.slack.jsonText)])
    }

    /// The URL a target names and whether to sign for it; nil when no configured sink has that
    /// name any more (the configuration changed since it was queued).
    package func resolve(_ target: String) -> (url: URL, signed: Bool)? {
        if target == "slack" { return slack.map { ($0, false) } }
        return webhooks.first { Self.target(webhook: $0) == target }.map { ($0, true) }
    }
}

/// A sink message to enqueue: which sink, which message kind (`alert_firing`, `alert_updated_<n>`,
/// `alert_resolved`, `alert_test`), the exact body.
package struct SinkMessage: Sendable, Equatable {
    package var target: String
    package var kind: String
    package var body: String

    package init(target: String, kind: String, body: String) {
        self.target = target
        self.kind = kind
        self.body = body
    }
}
