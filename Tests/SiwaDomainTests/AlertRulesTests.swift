import Foundation
import SiwaDomain
import Testing

/// `AlertRules.decide`: every rule from one set of observations, pure.
@Suite("Alert rules: observations and open episodes in, decisions out")
struct AlertRulesTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600 + 40 * 86_400)

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
        var observed = AlertObservations()
        observed.spikes = [SpikeCounts(aud: "com.example.app", type: "consent-revoked", window: 80, days: Array(repeating: 12, count: 7))]
        observed.firstSeen = ["com.example.app": Self.now.addingTimeInterval(-30 * 86_400)]
        observed.signals = OperationalSignals(queueLag: 600)
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
        let decided = AlertRules.decide(observed, open: [], now: Self.now, settings: AlertRuleSettings())
        #expect(
            Self.kinds(decided) == [
                "fire queue_lag", "fire revocation_spike/com.example.app", "fire transfer_deadline/com.example.app/to TEAMB23456",
                "fire quiet_app/com.example.busy",
            ], "\(decided)")

        // The same round with those episodes open: nothing new to say.
        let open = decided.compactMap(\.episode)
        let again = Self.kinds(AlertRules.decide(observed, open: open, now: Self.now, settings: AlertRuleSettings()))
        #expect(!again.contains { $0.hasPrefix("fire") || $0.hasPrefix("join") || $0.hasPrefix("resolve") }, "\(again)")
        // The queue drained, users migrated, the app heard from: those resolve (queue_lag after its delay).
        var cleared = observed
        cleared.signals = OperationalSignals()
        cleared.transfers[0].usersLeft = 0
        cleared.apps[0].lastArrival = Self.now.addingTimeInterval(60)
        let later = Self.now.addingTimeInterval(120)
        let resolving = Self.kinds(AlertRules.decide(cleared, open: open, now: later, settings: AlertRuleSettings()))
        #expect(resolving.contains("resolve transfer_deadline/com.example.app/to TEAMB23456") && resolving.contains("resolve quiet_app/com.example.busy"), "\(resolving)")
        #expect(resolving.contains("update queue_lag"), "normal since now: waiting out the resolve delay")
    }
}
