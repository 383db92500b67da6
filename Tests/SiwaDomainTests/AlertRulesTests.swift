import Foundation
import SiwaDomain
import Testing

/// `AlertRules.decide`: every rule from its own observation, pure.
@Suite("Alert rules: observations and open episodes in, decisions out", .timeLimit(.minutes(10)))
struct AlertRulesTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600 + 40 * 86_400)

    /// What the built-in rules observe in these cases (the others observe nothing).
    struct Observed {
        var revocations = RevocationCounts()
        var queueLag = 0
        var transfers: [TransferBacklog] = []
        var apps: [AppActivity] = []
    }

    /// The built-in rules with the default settings, in the monitor's order, each with its observation.
    static func decide(_ observed: Observed, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let settings = AlertRuleSettings()
        let resolveAfter = settings.spike.resolveAfter
        return AlertRules.decide(
            [
                ObservedAlertRule(AppleCredentialsRule(resolveAfter: resolveAfter), observed: 0),
                ObservedAlertRule(BadSignaturesRule(threshold: settings.badSignatures, resolveAfter: resolveAfter), observed: [:]),
                ObservedAlertRule(EndpointHealthRule(certificateDays: settings.endpoint.certificateDays, resolveAfter: resolveAfter), observed: nil),
                ObservedAlertRule(JobsDiscardedRule(threshold: settings.discardedJobs, resolveAfter: resolveAfter), observed: [:]),
                ObservedAlertRule(QueueLagRule(threshold: settings.queueLag, resolveAfter: resolveAfter), observed: observed.queueLag),
                ObservedAlertRule(RevocationSpikeRule(settings: settings.spike), observed: observed.revocations),
                ObservedAlertRule(TransferDeadlineRule(settings: settings.transferDeadline), observed: observed.transfers),
                ObservedAlertRule(QuietRule(settings: settings.quiet), observed: observed.apps),
            ], open: open, now: now)
    }

    static func kinds(_ decisions: [AlertDecision]) -> [String] {
        decisions.compactMap { decision in
            guard let episode = decision.episode else { return nil }
            let verb = switch decision {
            case .fire: "fire"
            case .update: "update"
            case .join: "join"
            case .resolve: "resolve"
            case .none: "none"
            }
            return "\(verb) \(episode.key)"
        }
    }

    @Test("a spike, a lagging queue, a transfer near its deadline and a quiet app each fire once; nothing is decided for a healthy series")
    func everyRule() {
        var observed = Observed()
        observed.revocations = RevocationCounts(
            spikes: [SpikeCounts(aud: "com.example.app", type: "consent-revoked", window: 80, days: Array(repeating: 12, count: 7))],
            firstSeen: ["com.example.app": Self.now.addingTimeInterval(-30 * 86_400)])
        observed.queueLag = 600
        let transfer = TransferDeadlineRule.key(aud: "com.example.app", outgoing: true, team: "TEAMB23456")
        observed.transfers = [
            TransferBacklog(key: transfer, window: TransferWindow(transferredAt: Self.now.addingTimeInterval(-50 * 86_400)), usersLeft: 9)
        ]
        // Busy in every span for four weeks, silent for two hours.
        let first = Self.now.addingTimeInterval(-35 * 86_400)
        observed.apps = [
            AppActivity(
                aud: "com.example.busy", firstSeen: first, lastArrival: Self.now.addingTimeInterval(-7200),
                history: QuietRule.history(now: Self.now, firstSeen: first), activeSpans: Dictionary(uniqueKeysWithValues: (0..<168).map { ($0, 24) }))
        ]
        let decided = Self.decide(observed, open: [], now: Self.now)
        #expect(
            Self.kinds(decided) == [
                "fire queue_lag", "fire revocation_spike/com.example.app", "fire transfer_deadline/com.example.app/to TEAMB23456",
                "fire quiet_app/com.example.busy",
            ], "\(decided)")

        // The same round with those episodes open: nothing new to say.
        let open = decided.compactMap(\.episode)
        let again = Self.kinds(Self.decide(observed, open: open, now: Self.now))
        #expect(!again.contains { $0.hasPrefix("fire") || $0.hasPrefix("join") || $0.hasPrefix("resolve") }, "\(again)")
        // The queue drained, users migrated, the app heard from: those resolve (queue_lag after its delay).
        var cleared = observed
        cleared.queueLag = 0
        cleared.transfers[0].usersLeft = 0
        cleared.apps[0].lastArrival = Self.now.addingTimeInterval(60)
        let later = Self.now.addingTimeInterval(120)
        let resolving = Self.kinds(Self.decide(cleared, open: open, now: later))
        #expect(resolving.contains("resolve transfer_deadline/com.example.app/to TEAMB23456") && resolving.contains("resolve quiet_app/com.example.busy"), "\(resolving)")
        #expect(resolving.contains("update queue_lag"), "normal since now: waiting out the resolve delay")
    }

    /// Fires once its observation is true, and stays quiet otherwise.
    struct Flag: AlertRule {
        let kind: AlertKind
        func step(_ on: Bool, open: [AlertEpisode], now: Date) -> [AlertDecision] {
            AlertLifecycle.step([AlertKey(kind: kind): .atLeast(1, value: on ? 1 : 0)], open: open, now: now, resolveAfter: .zero)
        }
        func subject(_ message: AlertMessage) -> String { "flag \(kind) raised" }
    }

    @Test("each rule is handed its own kind's open episodes only; an episode of a kind no rule owns is left open")
    func ownKindOnly() {
        let (red, blue) = (AlertKind("red_flag"), AlertKind("blue_flag"))
        let orphan = AlertEpisode(key: AlertKey(kind: AlertKind("gone_rule")), startedAt: Self.now, value: 1, peak: 1, baseline: nil, threshold: 1)
        let fired = AlertRules.decide(
            [ObservedAlertRule(Flag(kind: red), observed: true), ObservedAlertRule(Flag(kind: blue), observed: false)], open: [orphan], now: Self.now)
        #expect(Self.kinds(fired) == ["fire red_flag"], "\(fired)")
        let open = fired.compactMap(\.episode) + [orphan]
        let later = Self.now.addingTimeInterval(60)
        let resolved = AlertRules.decide(
            [ObservedAlertRule(Flag(kind: red), observed: false), ObservedAlertRule(Flag(kind: blue), observed: false)], open: open, now: later)
        #expect(Self.kinds(resolved) == ["resolve red_flag"], "\(resolved)")
        #expect(AlertKind(rawValue: "Not-A-Kind") == nil && AlertKind(rawValue: String(repeating: "a", count: 41)) == nil)
        #expect(Flag(kind: red).text(AlertMessage(id: 3, episode: orphan, window: .seconds(60), resolvedAt: nil)).contains("[gone_rule] flag red_flag raised"))
    }
}
