import SiwaDomain
import SiwaStore

/// What every lane's jobs share: how long a claim is held without a heartbeat, how often an idle
/// loop looks for work, attempts and backoff, and whether NOTIFY wakes the loops.
package struct QueuePolicy: Sendable {
    package var lease: Duration = EffectStore.defaultLease
    /// How often an idle loop claims while no LISTEN wakes it (notify off, or the listener down).
    package var pollInterval: Duration = .milliseconds(100)
    /// While LISTEN holds, how often the process's one check looks for work a lost NOTIFY left
    /// (a retry falling due is checked for at its time).
    package var checkInterval: Duration = .seconds(10)
    package var maxAttempts = 25
    package var backoff = RetryBackoff()
    /// LISTEN for `siwa_jobs` (off: poll only, e.g. behind a transaction-mode pooler).
    package var listen = true

    package init() {}

    package var retry: RetryPolicy { RetryPolicy(maxAttempts: maxAttempts, backoff: backoff) }
}

/// The effect workers: how many loops, how many jobs a claim takes, what effects do.
package struct EffectSettings: Sendable {
    package var workers = 4
    /// Jobs one claim takes at most: a backlog drains in batches this size (BENCHMARKS.md); a
    /// steady flow's batches are smaller.
    package var batchSize = 400
    package var eraseOnDelete = true
    /// Apple's own `account-delete`/`consent-revoked` queue the user's kept tokens for revocation
    /// too (with Apple credentials); off, they are deleted (Apple has ended them).
    package var revokeOnAppleEvents = false
    /// `consent-revoked` suppresses the user's addresses too (`SIWA_SUPPRESS_ON_CONSENT_REVOKED`).
    package var suppressOnConsentRevoked = false

    package init() {}
}

/// Where the delivery lanes deliver: a lane runs when its destination is set.
package struct DeliveryDestinations: Sendable {
    /// Lane `callbacks`: where to POST after effects (nil: no callbacks).
    package var callbacks: Callbacks?
    /// Lane `alerts`: where alert messages go (empty: the log only).
    package var alertSinks = AlertSinks()
    /// Lanes `apple_revocations` and, with `AppleTokenValidator`, `apple_validations` (nil: no
    /// Apple credentials).
    package var apple: AppleRevocations?
    /// Lanes `suppressions_<provider>`: the mail providers kept in line (empty: the feed only).
    package var mail: MailProviders?

    package init() {}
}

/// The queue's upkeep: finished jobs kept for `retention`; the maintainer rescues expired leases
/// every `interval`; the stats folder folds `foldInterval` after ingest (`StatsFolder`).
package struct QueueUpkeep: Sendable {
    package var retention: Duration = .seconds(7 * 86_400)
    package var interval: Duration = .seconds(60)
    package var foldInterval: Duration = .seconds(5)

    package init() {}
}
