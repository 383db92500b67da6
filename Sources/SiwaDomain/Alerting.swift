import Crypto
import Foundation

/// An alert rule's name (`alerts.kind`, `alert_silences.kind`, a message's `kind`): lowercase
/// letters, digits and `_`, at most 40, the form the schema checks (sql/026). The built-in rules'
/// kinds are named here for their call sites; a rule declared elsewhere names its own, and no list
/// has to learn it.
package struct AlertKind: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    package let rawValue: String

    /// Names a kind; `name` must have the form above.
    package init(_ name: String) {
        precondition(Self.isValidName(name), "an alert kind is lowercase letters, digits and _ (at most 40): \(name)")
        rawValue = name
    }

    /// The kind named `rawValue`; nil when it does not have the form above.
    package init?(rawValue: String) {
        guard Self.isValidName(rawValue) else { return nil }
        self.rawValue = rawValue
    }

    package var description: String { rawValue }

    /// `^[a-z][a-z0-9_]{0,39}$`, as the schema's CHECK has it.
    package static let pattern = "^[a-z][a-z0-9_]{0,39}$"

    package static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        return (1...40).contains(bytes.count) && (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(bytes[0])
            && bytes.allSatisfy { (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: "_") }
    }

    package static let revocationSpike = AlertKind("revocation_spike")
    package static let jobsDiscarded = AlertKind("jobs_discarded")
    package static let queueLag = AlertKind("queue_lag")
    package static let badSignatures = AlertKind("bad_signatures")
    package static let appleCredentials = AlertKind("apple_credentials")
    package static let transferDeadline = AlertKind("transfer_deadline")
    package static let quietApp = AlertKind("quiet_app")
    package static let endpointUnhealthy = AlertKind("endpoint_unhealthy")
    package static let suppressionTargetFailing = AlertKind("suppression_target_failing")
    /// `siwa-events alerts test`: checks every sink; no rule fires it.
    package static let test = AlertKind("test")
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
    /// Every series of a rule whose episodes are its series, in key order: each observed one, and
    /// each open one, which is quiet (not breaching) when nothing was counted for it this round.
    package static func step(
        _ observations: [AlertKey: AlertObservation], open: [AlertEpisode], now: Date, resolveAfter: Duration
    ) -> [AlertDecision] {
        let openByKey = Dictionary(open.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        return Set(observations.keys).union(openByKey.keys).sorted { $0.description < $1.description }.map { key in
            let record = openByKey[key]
            let observation = observations[key] ?? AlertObservation(value: 0, baseline: nil, threshold: record?.threshold ?? 0, breaching: false)
            return step(open: record, key: key, observation: observation, now: now, resolveAfter: resolveAfter)
        }
    }

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
    /// (series only join, so n grows with each update). `subject`: what the message's rule says
    /// of it (`AlertRule.subject`).
    package func messages(_ message: AlertMessage, subject: String) -> [SinkMessage] {
        let kind = switch (message.episode.key.kind, message.state) {
        case (.test, _): "alert_test"
        case (_, .updated): "alert_updated_\(message.series.count)"
        case (_, let state): "alert_\(state.rawValue)"
        }
        return webhooks.map { SinkMessage(target: Self.target(webhook: $0), kind: kind, body: message.json.jsonText) }
            + (slack == nil ? [] : [SinkMessage(target: "slack", kind: kind, body: message.slack(subject: subject).jsonText)])
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
