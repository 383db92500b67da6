import Foundation

/// `apple_credentials`: Apple refused our client secret (`invalid_client`), so calls to
/// `/auth/token` and `/auth/revoke` all fail until the credentials are fixed. One series; it
/// observes the calls refused so in the window, and fires at the first.
package struct AppleCredentialsRule: AlertRule {
    package let kind = AlertKind.appleCredentials
    package var resolveAfter: Duration

    package init(resolveAfter: Duration) {
        self.resolveAfter = resolveAfter
    }

    package func step(_ refused: Int, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        AlertLifecycle.step([AlertKey(kind: kind): .atLeast(1, value: refused)], open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        "Apple refused our client secret (invalid_client) \(message.episode.peak) times in \(DurationSyntax.format(message.window)): "
            + "check SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and the .p8"
    }
}
