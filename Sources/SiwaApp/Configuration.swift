import Logging
import SiwaApple
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let role = Setting<Configuration.Role>.choice(
        "SIWA_ROLE", flag: "role", .process, default: .all, expected: "all, receiver or worker",
        help: "all|receiver|worker: what this process runs",
        docs: "`all`, `receiver` or `worker`: what this process runs.")
    package static let shutdownGrace = Setting<Duration>.duration(
        "SIWA_SHUTDOWN_GRACE", flag: "shutdown-grace", .process, default: .seconds(20),
        help: "on SIGTERM, how long in-flight requests and deliveries get to finish",
        docs: "On SIGTERM/SIGINT: stop accepting connections, let in-flight requests and deliveries finish this long, hand back held deliveries, exit 0 (an effect batch still running is abandoned: it commits or rolls back whole, and a rolled-back one is applied after the restart); what is still running then is cancelled (exit 1). Keep it under your orchestrator's kill timeout.")

    static let process = [role.info, shutdownGrace.info]
}

/// What `serve` runs with: each component's configuration, read from the settings beside it
/// (`Settings/`), every one checked before anything starts; a bad value stops start-up with a
/// message naming its variable and flag.
package struct Configuration: Sendable {
    package enum Role: String, Sendable, CaseIterable { case all, receiver, worker }
    /// What this process runs.
    package var role: Role
    /// SIGTERM/SIGINT: how long in-flight requests and the workers' batches get to finish before
    /// what is left is cancelled (a second signal cancels at once).
    package var shutdownGrace: Duration
    package var database: DatabaseSettings
    package var apple: AppleSettings
    package var http: HTTPSettings
    package var rejections: RejectionLimits
    /// The lifetime of a session created without `expires_at`.
    package var sessionTTL: Duration
    package var workers: EffectWorkers.Configuration
    package var alerts: AlertMonitor.Configuration
    /// For calls to Apple's auth endpoints; nil when not configured.
    package var appleCredentials: AppleCredentials?

    /// The receiving process's HTTP routes and key cache are needed (roles all, receiver).
    package var receives: Bool { role != .worker }
    /// This process runs effect workers (roles all, worker).
    package var works: Bool { role != .receiver }

    /// Every setting is read and checked, also those the role does not use, so a bad value is
    /// found whichever role starts first.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        role = try source.value(Settings.role)
        shutdownGrace = try source.value(Settings.shutdownGrace)
        apple = try AppleSettings(source, receiving: role != .worker)
        appleCredentials = try AppleCredentials.configured(source)
        database = try DatabaseSettings(source)
        http = try HTTPSettings(source)
        rejections = try RejectionLimits(source)
        sessionTTL = try source.value(Settings.sessionTTL)
        workers = try EffectWorkers.Configuration(source)
        if let credentials = appleCredentials {
            workers.lanes.apple = AppleRevocations(client: credentials.client(), cipher: credentials.tokenCipher)
            workers.lanes.apple?.concurrency = credentials.revocationConcurrency
            workers.effects.revokeOnAppleEvents = credentials.revokeOnAppleEvents
            workers.appleValidation = credentials.validation
        }
        workers.lanes.mail = try MailProviders.configured(source, apps: apple.bundleIDs)
        workers.effects.suppressOnConsentRevoked = try source.value(Settings.suppressOnConsentRevoked)
        alerts = try AlertMonitor.Configuration(source)
        alerts.apps = apple.bundleIDs.sorted()
    }

    /// What the start-up log says of the optional parts: on (and how, without a secret) or off.
    package var optionalParts: Logger.Metadata {
        let apple = appleCredentials
        let sinks = workers.lanes.alertSinks
        let sinkNames = (sinks.slack == nil ? [] : ["slack"]) + (sinks.webhooks.isEmpty ? [] : ["\(sinks.webhooks.count) webhook(s)"])
        return [
            "apple_credentials": "\(apple.map { "team \($0.policy.teamID), key \($0.key.keyID), \(URLRedaction.redacted($0.authURL))" } ?? "off")",
            "apple_token_keys": "\(apple.map { "\($0.tokenCipher.keyIDs.count) key(s), encrypting under \($0.tokenCipher.currentKeyID)" } ?? "off")",
            "apple_revoke_on_events": "\(apple.map { $0.revokeOnAppleEvents ? "on" : "off" } ?? "off")",
            "apple_token_validation": "\(apple?.validation.map { "on, \($0.perMinute)/min" } ?? "off")",
            "callbacks": "\(workers.lanes.callbacks.map { URLRedaction.redacted($0.url) } ?? "off")",
            "alert_sinks": "\(sinkNames.isEmpty ? "off (the log only)" : sinkNames.joined(separator: ", "))",
            "suppression_targets": "\(workers.lanes.mail.map { $0.targets.map(\.rawValue).joined(separator: ", ") } ?? "off (the feed only)")",
            "endpoint_check": "\(alerts.endpoint.url.map { URLRedaction.redacted($0) } ?? "off")",
        ]
    }
}
