import Foundation

/// `bad_signatures`: deliveries refused because their RS256 signature did not verify, or named a
/// key Apple's set does not have, at least `threshold` in the window. One series; it observes the
/// rejections in the window by reason.
package struct BadSignaturesRule: AlertRule {
    /// The rejection reasons it counts (recorded or sampled out).
    package static let reasons = ["bad_signature", "unknown_key"]

    package let kind = AlertKind.badSignatures
    package var threshold: Int
    package var resolveAfter: Duration

    package init(threshold: Int, resolveAfter: Duration) {
        self.threshold = threshold
        self.resolveAfter = resolveAfter
    }

    /// The deliveries it counts among `rejected` (by reason).
    package static func count(_ rejected: [String: Int]) -> Int {
        reasons.map { rejected[$0] ?? 0 }.reduce(0, +)
    }

    package func step(_ rejected: [String: Int], open: [AlertEpisode], now: Date) -> [AlertDecision] {
        let observation = AlertObservation.atLeast(threshold, value: Self.count(rejected))
        return AlertLifecycle.step([AlertKey(kind: kind): observation], open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        "\(message.episode.peak) deliveries with a bad signature in \(DurationSyntax.format(message.window))"
    }
}
