import Foundation
import Logging
import SiwaDomain
import SiwaHTTP
import SiwaStore

/// A setting that could not be used: names the variable (and its flag) and what is expected.
package struct ConfigurationError: Error, CustomStringConvertible {
    package let variable: String
    package let message: String
    package var description: String { "\(variable): \(message)" }
}

/// Every setting of the service, validated once at the edge. Each comes from an environment
/// variable, overridden by the matching flag; a bad value stops start-up with a message naming it.
package struct Configuration: Sendable {
    package static let appleJWKSURL = URL(string: "https://appleid.apple.com/auth/keys")!

    package var databaseURL: String?
    package var bundleIDs: [String]
    package var jwksURL: URL = Self.appleJWKSURL
    package var host = "127.0.0.1"
    package var port = 8080
    /// The admin listener: the API, the dashboard, /openapi.yaml and /metrics.
    package var adminHost = "127.0.0.1"
    package var adminPort = 8081
    package var connectionLimits = ConnectionLimits()
    package var dataDirectory = "./.siwa"
    package var embeddedDatabase = true
    package var migrateOnStart = true
    package var trustedProxies = TrustedProxies.none
    package var jwksRefreshInterval: Duration = .seconds(3600)
    package var unknownKidCooldown: Duration = .seconds(60)
    package var clockSkew: Duration = .seconds(60)
    package var rejectionsPerMinute = 60
    /// Genuine tokens for another bundle ID kept whole, per `aud` per hour.
    package var otherAppTokensPerHour = 20
    /// How long such a kept token stays (enough to replay after fixing a bundle-ID typo).
    package var otherAppTokenRetention: Duration = .seconds(7 * 86_400)
    package var databasePoolSize = 32
    package var databaseTimeout: Duration = .seconds(5)
    package var commitQueueLimit = GroupCommitter.defaultMaximumQueued
    /// SIGTERM/SIGINT: how long in-flight requests and the workers' batches get to finish before
    /// what is left is cancelled (a second signal cancels at once).
    package var shutdownGrace: Duration = .seconds(20)
    package enum Role: String, Sendable, CaseIterable { case all, receiver, worker }
    package var role = Role.all
    package var workers = 4
    package var jobLease: Duration = EffectStore.defaultStall
    package var jobMaxAttempts = 25
    package var jobRetention: Duration = .seconds(7 * 86_400)
    package var jobPollInterval: Duration = .milliseconds(100)
    package var jobNotify = true
    package var eraseOnDelete = true
    /// Identity-token client IDs → the bundle ID whose accounts they sign in to.
    package var clientIDs: [String: String] = [:]
    package var sessionTTL: Duration = .seconds(30 * 86_400)
    package var historyRetention: Duration = .seconds(400 * 86_400)
    package var metricsToken: String?
    /// Serve HTTPS directly (PEM files: the certificate chain, leaf first, and its private key).
    /// Without them: plain HTTP behind a TLS-terminating proxy.
    package var tlsCertificateFile: String?
    package var tlsKeyFile: String?
    package var callbackURL: URL?
    package var callbackSigner: WebhookSigner?
    /// Signs alert webhooks: a secret of its own, so whoever verifies alerts cannot forge callbacks.
    package var alertSigner: WebhookSigner?
    package var callbackTimeout: Duration = .seconds(10)
    package var callbackConcurrency = 16
    package var spike = SpikeSettings()
    package var alertWebhooks: [URL] = []
    package var alertSlackURL: URL?
    package var alertQueueLag: Duration = .seconds(120)
    package var alertBadSignatures = 20
    package var alertDiscardedJobs = 1
    /// nil: the command's own default (`info` for `serve`, `warning` for one-shot commands).
    package var logLevel: Logger.Level?
    package var logFormat = LogFormat.text

    /// The receiving process's HTTP routes and key cache are needed (roles all, receiver).
    package var receives: Bool { role != .worker }
    /// This process runs effect workers (roles all, worker).
    package var works: Bool { role != .receiver }

    package init(bundleIDs: [String]) {
        self.bundleIDs = bundleIDs
        self.clientIDs = Dictionary(bundleIDs.map { ($0, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// The variables, their flags and what they mean (README's configuration reference mirrors it).
    package static let variables: [(name: String, flag: String, help: String)] = [
        ("DATABASE_URL", "--database-url", "PostgreSQL URL; without it the embedded cluster under SIWA_DATA_DIR is used"),
        ("SIWA_APPLE_BUNDLE_IDS", "--bundle-ids", "comma-separated bundle IDs accepted as aud (required to serve)"),
        ("SIWA_APPLE_JWKS_URL", "--jwks-url", "Apple's key set (https:// or file://)"),
        ("SIWA_HOST", "--host", "address to listen on"),
        ("SIWA_PORT", "--port", "port to listen on"),
        ("SIWA_ADMIN_HOST", "--admin-host", "address of the admin listener (API, dashboard, /metrics)"),
        ("SIWA_ADMIN_PORT", "--admin-port", "port of the admin listener"),
        ("SIWA_HTTP_REQUEST_TIMEOUT", "--http-request-timeout", "a request's head and body must arrive within this from its first byte"),
        ("SIWA_HTTP_IDLE_TIMEOUT", "--http-idle-timeout", "a connection without a request in progress is closed after this"),
        ("SIWA_TLS_HANDSHAKE_TIMEOUT", "--tls-handshake-timeout", "a TLS handshake must complete within this (with SIWA_TLS_CERT_FILE)"),
        ("SIWA_HTTP_MAX_CONNECTIONS", "--http-max-connections", "open connections per listener at most; one more is closed at once"),
        ("SIWA_DATA_DIR", "--data-dir", "where the embedded PostgreSQL keeps its data"),
        ("SIWA_EMBEDDED_DATABASE", "--embedded-database", "on|off: may a missing DATABASE_URL start the embedded cluster"),
        ("SIWA_MIGRATE_ON_START", "--migrate-on-start", "true|false: apply pending migrations when serving"),
        ("SIWA_TRUSTED_PROXIES", "--trusted-proxies", "CIDR list whose X-Forwarded-For is believed"),
        ("SIWA_JWKS_REFRESH_INTERVAL", "--jwks-refresh-interval", "scheduled key set refresh"),
        ("SIWA_JWKS_UNKNOWN_KID_COOLDOWN", "--jwks-unknown-kid-cooldown", "minimum time between unknown-kid refreshes"),
        ("SIWA_CLOCK_SKEW", "--clock-skew", "allowance on exp/iat"),
        ("SIWA_REJECTIONS_PER_MINUTE", "--rejections-per-minute", "rejection rows kept per reason per minute"),
        ("SIWA_OTHER_APP_TOKENS_PER_HOUR", "--other-app-tokens-per-hour", "genuine tokens for an unknown bundle ID kept whole, per aud per hour (the rest counted)"),
        ("SIWA_OTHER_APP_TOKEN_RETENTION", "--other-app-token-retention", "kept tokens for unknown bundle IDs are deleted after this"),
        ("SIWA_DATABASE_POOL_SIZE", "--database-pool-size", "maximum PostgreSQL connections"),
        ("SIWA_DATABASE_TIMEOUT", "--database-timeout", "longest wait for the database before answering 503"),
        ("SIWA_COMMIT_QUEUE_LIMIT", "--commit-queue-limit", "notifications waiting for a commit at most; more are answered 503 at once"),
        ("SIWA_SHUTDOWN_GRACE", "--shutdown-grace", "on SIGTERM, how long in-flight requests and deliveries get to finish"),
        ("SIWA_ROLE", "--role", "all|receiver|worker: what this process runs"),
        ("SIWA_WORKERS", "--workers", "effect worker loops in this process"),
        ("SIWA_JOB_LEASE", "--job-lease", "how long a claimed delivery stays held without a heartbeat, and an effect batch may sit idle"),
        ("SIWA_JOB_MAX_ATTEMPTS", "--job-max-attempts", "attempts before a job is discarded"),
        ("SIWA_JOB_RETENTION", "--job-retention", "how long finished jobs are kept"),
        ("SIWA_JOB_POLL_INTERVAL", "--job-poll-interval", "idle workers look for jobs this often (NOTIFY wakes them sooner)"),
        ("SIWA_JOB_NOTIFY", "--job-notify", "on|off: LISTEN for enqueue notifications"),
        ("SIWA_ERASE_ON_DELETE", "--erase-on-delete", "true|false: erase a deleted account's email everywhere"),
        ("SIWA_APPLE_CLIENT_IDS", "--client-ids", "identity-token aud values accepted by POST /v1/sessions: id or servicesID=bundleID"),
        ("SIWA_HISTORY_RETENTION", "--history-retention", "notifications and rejections older than this are pruned"),
        ("SIWA_SESSION_TTL", "--session-ttl", "lifetime of a session created without expires_at"),
        ("SIWA_METRICS_TOKEN", "--metrics-token", "when set, /metrics needs Authorization: Bearer <it>"),
        ("SIWA_TLS_CERT_FILE", "--tls-cert-file", "serve HTTPS: PEM certificate chain, leaf first (with SIWA_TLS_KEY_FILE)"),
        ("SIWA_TLS_KEY_FILE", "--tls-key-file", "serve HTTPS: PEM private key of the certificate"),
        ("SIWA_CALLBACK_URL", "--callback-url", "http(s) endpoint POSTed a signed callback after each effect (unset: none)"),
        ("SIWA_CALLBACK_SECRET", "--callback-secret", "space-separated whsec_ secrets that sign callbacks (all sign: rotation)"),
        ("SIWA_CALLBACK_TIMEOUT", "--callback-timeout", "one callback attempt's limit"),
        ("SIWA_CALLBACK_CONCURRENCY", "--callback-concurrency", "callbacks in flight at once per process"),
        ("SIWA_SPIKE_INTERVAL", "--spike-interval", "how often alerts are evaluated"),
        ("SIWA_SPIKE_WINDOW", "--spike-window", "the window whose revocations are compared with the baseline"),
        ("SIWA_SPIKE_MIN_COUNT", "--spike-min-count", "a spike needs at least this many revocations in the window"),
        ("SIWA_SPIKE_FACTOR", "--spike-factor", "…and at least this many times the baseline"),
        ("SIWA_SPIKE_NEW_APP_COUNT", "--spike-new-app-count", "an app with under a day of history fires at this many in the window"),
        ("SIWA_SPIKE_RESOLVE_AFTER", "--spike-resolve-after", "an alert resolves after this long back to normal"),
        ("SIWA_ALERT_WEBHOOK_URLS", "--alert-webhook-urls", "comma-separated http(s) URLs POSTed each alert, signed with SIWA_ALERT_SECRET"),
        ("SIWA_ALERT_SECRET", "--alert-secret", "space-separated whsec_ secrets that sign alert webhooks (never a callback secret)"),
        ("SIWA_ALERT_SLACK_URL", "--alert-slack-url", "a Slack-compatible incoming-webhook URL for alerts"),
        ("SIWA_ALERT_QUEUE_LAG", "--alert-queue-lag", "queue_lag fires when the oldest ready job has waited this long"),
        ("SIWA_ALERT_BAD_SIGNATURES", "--alert-bad-signatures", "bad_signatures fires at this many in the spike window"),
        ("SIWA_ALERT_DISCARDED_JOBS", "--alert-discarded-jobs", "jobs_discarded fires at this many discards in the spike window"),
        ("SIWA_LOG_LEVEL", "--log-level", "trace|debug|info|notice|warning|error|critical (default: info for serve, warning otherwise)"),
        ("SIWA_LOG_FORMAT", "--log-format", "text|json: key=value lines (values quoted when needed) or one JSON object per line"),
    ]

    /// The logging settings alone (every command reads them, also those that read nothing else).
    package static func logging(environment: [String: String], overrides: [String: String] = [:]) throws(ConfigurationError) -> (level: Logger.Level?, format: LogFormat) {
        func value(_ name: String) -> String? {
            (overrides[name] ?? environment[name]).map { $0.trimmingCharacters(in: .whitespaces) }.flatMap { $0.isEmpty ? nil : $0 }
        }
        var level: Logger.Level?
        if let text = value("SIWA_LOG_LEVEL") {
            guard let parsed = Logger.Level(rawValue: text.lowercased()) else {
                throw ConfigurationError(
                    variable: "SIWA_LOG_LEVEL (--log-level)",
                    message: "must be one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")) (got \"\(text)\")")
            }
            level = parsed
        }
        var format = LogFormat.text
        if let text = value("SIWA_LOG_FORMAT") {
            guard let parsed = LogFormat(rawValue: text.lowercased()) else {
                throw ConfigurationError(variable: "SIWA_LOG_FORMAT (--log-format)", message: "must be text or json (got \"\(text)\")")
            }
            format = parsed
        }
        return (level, format)
    }

    /// Builds the configuration from `environment`, with `overrides` (flag values keyed by variable
    /// name) taking precedence. `requireBundleIDs` is true for commands that receive notifications.
    package static func load(environment: [String: String], overrides: [String: String] = [:], requireBundleIDs: Bool) throws(ConfigurationError) -> Configuration {
        func value(_ name: String) -> String? {
            let raw = overrides[name] ?? environment[name]
            guard let raw, !raw.trimmingCharacters(in: .whitespaces).isEmpty else { return nil }
            return raw.trimmingCharacters(in: .whitespaces)
        }
        func flag(_ name: String) -> String {
            variables.first { $0.name == name }.map { "\(name) (\($0.flag))" } ?? name
        }
        func duration(_ name: String, default fallback: Duration) throws(ConfigurationError) -> Duration {
            guard let text = value(name) else { return fallback }
            do {
                return try DurationSyntax.parse(text)
            } catch {
                throw ConfigurationError(variable: flag(name), message: error.description)
            }
        }
        func integer(_ name: String, _ range: ClosedRange<Int>, default fallback: Int) throws(ConfigurationError) -> Int {
            guard let text = value(name) else { return fallback }
            guard let number = Int(text), range.contains(number) else {
                throw ConfigurationError(variable: flag(name), message: "must be an integer between \(range.lowerBound) and \(range.upperBound) (got \"\(text)\")")
            }
            return number
        }
        func positive(_ name: String, _ fallback: Duration) throws(ConfigurationError) -> Duration {
            let value = try duration(name, default: fallback)
            guard value >= .seconds(1) else { throw ConfigurationError(variable: flag(name), message: "must be at least 1s (got \(DurationSyntax.format(value)))") }
            return value
        }
        func boolean(_ name: String, default fallback: Bool) throws(ConfigurationError) -> Bool {
            guard let text = value(name)?.lowercased() else { return fallback }
            switch text {
            case "1", "true", "on", "yes": return true
            case "0", "false", "off", "no": return false
            default: throw ConfigurationError(variable: flag(name), message: "must be on or off (true/false) (got \"\(text)\")")
            }
        }

        let bundleIDs = (value("SIWA_APPLE_BUNDLE_IDS") ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        let receiving = (value("SIWA_ROLE")?.lowercased() ?? "all") != "worker"
        if requireBundleIDs && receiving && bundleIDs.isEmpty {
            throw ConfigurationError(
                variable: flag("SIWA_APPLE_BUNDLE_IDS"),
                message: "is required: the comma-separated bundle IDs of your apps (Apple's aud), e.g. SIWA_APPLE_BUNDLE_IDS=com.example.app")
        }
        var config = Configuration(bundleIDs: bundleIDs)
        (config.logLevel, config.logFormat) = try logging(environment: environment, overrides: overrides)
        if let url = value("DATABASE_URL") {
            config.databaseURL = url
        }
        if let text = value("SIWA_APPLE_JWKS_URL") {
            guard let url = URL(string: text), ["https", "http", "file"].contains(url.scheme ?? "") else {
                throw ConfigurationError(variable: flag("SIWA_APPLE_JWKS_URL"), message: "must be an https://, http:// or file:// URL (got \"\(text)\")")
            }
            config.jwksURL = url
        }
        config.host = value("SIWA_HOST") ?? config.host
        config.port = try integer("SIWA_PORT", 0...65535, default: config.port)
        config.adminHost = value("SIWA_ADMIN_HOST") ?? config.adminHost
        config.adminPort = try integer("SIWA_ADMIN_PORT", 0...65535, default: config.adminPort)
        if config.adminPort == config.port && config.port != 0 && config.adminHost == config.host {
            throw ConfigurationError(
                variable: flag("SIWA_ADMIN_PORT"), message: "must differ from SIWA_PORT (\(config.port)): the admin listener is a second one")
        }
        config.connectionLimits.requestTimeout = try positive("SIWA_HTTP_REQUEST_TIMEOUT", config.connectionLimits.requestTimeout)
        config.connectionLimits.idleTimeout = try positive("SIWA_HTTP_IDLE_TIMEOUT", config.connectionLimits.idleTimeout)
        config.connectionLimits.tlsHandshakeTimeout = try positive("SIWA_TLS_HANDSHAKE_TIMEOUT", config.connectionLimits.tlsHandshakeTimeout)
        config.connectionLimits.maximumConnections = try integer("SIWA_HTTP_MAX_CONNECTIONS", 1...1_000_000, default: config.connectionLimits.maximumConnections)
        config.dataDirectory = value("SIWA_DATA_DIR") ?? config.dataDirectory
        config.embeddedDatabase = try boolean("SIWA_EMBEDDED_DATABASE", default: true)
        config.migrateOnStart = try boolean("SIWA_MIGRATE_ON_START", default: true)
        if let text = value("SIWA_TRUSTED_PROXIES") {
            do {
                config.trustedProxies = try TrustedProxies(parsing: text)
            } catch {
                throw ConfigurationError(variable: flag("SIWA_TRUSTED_PROXIES"), message: error.description)
            }
        }
        config.jwksRefreshInterval = try duration("SIWA_JWKS_REFRESH_INTERVAL", default: config.jwksRefreshInterval)
        config.unknownKidCooldown = try duration("SIWA_JWKS_UNKNOWN_KID_COOLDOWN", default: config.unknownKidCooldown)
        config.clockSkew = try duration("SIWA_CLOCK_SKEW", default: config.clockSkew)
        config.rejectionsPerMinute = try integer("SIWA_REJECTIONS_PER_MINUTE", 0...1_000_000, default: config.rejectionsPerMinute)
        config.otherAppTokensPerHour = try integer("SIWA_OTHER_APP_TOKENS_PER_HOUR", 0...1_000_000, default: config.otherAppTokensPerHour)
        config.otherAppTokenRetention = try positive("SIWA_OTHER_APP_TOKEN_RETENTION", config.otherAppTokenRetention)
        config.databasePoolSize = try integer("SIWA_DATABASE_POOL_SIZE", 1...1000, default: config.databasePoolSize)
        config.databaseTimeout = try duration("SIWA_DATABASE_TIMEOUT", default: config.databaseTimeout)
        config.commitQueueLimit = try integer("SIWA_COMMIT_QUEUE_LIMIT", 1...1_000_000, default: config.commitQueueLimit)
        config.shutdownGrace = try duration("SIWA_SHUTDOWN_GRACE", default: config.shutdownGrace)
        if let text = value("SIWA_ROLE") {
            guard let role = Role(rawValue: text.lowercased()) else {
                throw ConfigurationError(variable: flag("SIWA_ROLE"), message: "must be all, receiver or worker (got \"\(text)\")")
            }
            config.role = role
        }
        config.workers = try integer("SIWA_WORKERS", 1...64, default: config.workers)
        config.jobLease = try duration("SIWA_JOB_LEASE", default: config.jobLease)
        config.jobMaxAttempts = try integer("SIWA_JOB_MAX_ATTEMPTS", 1...1000, default: config.jobMaxAttempts)
        config.jobRetention = try duration("SIWA_JOB_RETENTION", default: config.jobRetention)
        config.jobPollInterval = try duration("SIWA_JOB_POLL_INTERVAL", default: config.jobPollInterval)
        config.jobNotify = try boolean("SIWA_JOB_NOTIFY", default: true)
        config.eraseOnDelete = try boolean("SIWA_ERASE_ON_DELETE", default: true)
        func secretList(_ name: String) -> [Substring] {
            (value(name) ?? "").split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
        }
        func httpURL(_ name: String, _ text: String) throws(ConfigurationError) -> URL {
            guard let url = URL(string: text), ["https", "http"].contains(url.scheme?.lowercased() ?? ""), url.host?.isEmpty == false else {
                throw ConfigurationError(variable: flag(name), message: "must be an https:// or http:// URL (got \"\(text)\")")
            }
            return url
        }
        /// The secrets in `variable`, required because `user` (a variable) sends signed messages.
        func signer(_ variable: String, for user: String, _ what: String) throws(ConfigurationError) -> WebhookSigner {
            guard let secrets = value(variable) else {
                throw ConfigurationError(
                    variable: flag(variable),
                    message: "is required when \(user) is set: \(what); create one with `siwa-events callbacks secret`")
            }
            do {
                return try WebhookSigner(secrets: secrets)
            } catch {
                throw ConfigurationError(variable: flag(variable), message: error.description)
            }
        }
        if let text = value("SIWA_CALLBACK_URL") {
            let url = try httpURL("SIWA_CALLBACK_URL", text)
            config.callbackSigner = try signer("SIWA_CALLBACK_SECRET", for: "SIWA_CALLBACK_URL", "callbacks are always signed")
            config.callbackURL = url
        } else if value("SIWA_CALLBACK_SECRET") != nil {
            throw ConfigurationError(
                variable: flag("SIWA_CALLBACK_URL"),
                message: "is not set, but SIWA_CALLBACK_SECRET is: set the URL callbacks go to, or unset the secret (alert webhooks use SIWA_ALERT_SECRET)")
        }
        if let text = value("SIWA_ALERT_WEBHOOK_URLS") {
            for part in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).filter({ !$0.isEmpty }) {
                config.alertWebhooks.append(try httpURL("SIWA_ALERT_WEBHOOK_URLS", part))
            }
            config.alertSigner = try signer(
                "SIWA_ALERT_SECRET", for: "SIWA_ALERT_WEBHOOK_URLS",
                "alert webhooks are signed with a secret of their own, never the callback secret")
            let shared = Set(secretList("SIWA_ALERT_SECRET")).intersection(secretList("SIWA_CALLBACK_SECRET"))
            guard shared.isEmpty else {
                throw ConfigurationError(
                    variable: flag("SIWA_ALERT_SECRET"),
                    message: "must differ from every SIWA_CALLBACK_SECRET: whoever verifies alert webhooks could otherwise sign callbacks to your backend; create one with `siwa-events callbacks secret`")
            }
        } else if value("SIWA_ALERT_SECRET") != nil {
            throw ConfigurationError(
                variable: flag("SIWA_ALERT_WEBHOOK_URLS"), message: "is not set, but SIWA_ALERT_SECRET is: set the alert webhook URLs, or unset the secret")
        }
        if let text = value("SIWA_ALERT_SLACK_URL") { config.alertSlackURL = try httpURL("SIWA_ALERT_SLACK_URL", text) }
        config.spike.interval = try positive("SIWA_SPIKE_INTERVAL", config.spike.interval)
        config.spike.window = try positive("SIWA_SPIKE_WINDOW", config.spike.window)
        guard config.spike.window <= .seconds(6 * 3600) else {
            throw ConfigurationError(variable: flag("SIWA_SPIKE_WINDOW"), message: "must be at most 6h (per-second counts are kept a day)")
        }
        config.spike.resolveAfter = try duration("SIWA_SPIKE_RESOLVE_AFTER", default: config.spike.resolveAfter)
        config.spike.minCount = try integer("SIWA_SPIKE_MIN_COUNT", 1...10_000_000, default: config.spike.minCount)
        config.spike.newAppCount = try integer("SIWA_SPIKE_NEW_APP_COUNT", 1...10_000_000, default: config.spike.newAppCount)
        if let text = value("SIWA_SPIKE_FACTOR") {
            guard let factor = Double(text), factor.isFinite, factor > 1, factor <= 1000 else {
                throw ConfigurationError(variable: flag("SIWA_SPIKE_FACTOR"), message: "must be a number above 1 and at most 1000, e.g. 5 or 2.5 (got \"\(text)\")")
            }
            config.spike.factor = factor
        }
        config.alertQueueLag = try positive("SIWA_ALERT_QUEUE_LAG", config.alertQueueLag)
        config.alertBadSignatures = try integer("SIWA_ALERT_BAD_SIGNATURES", 1...10_000_000, default: config.alertBadSignatures)
        config.alertDiscardedJobs = try integer("SIWA_ALERT_DISCARDED_JOBS", 1...10_000_000, default: config.alertDiscardedJobs)
        if let text = value("SIWA_APPLE_CLIENT_IDS") {
            var map: [String: String] = [:]
            for entry in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).filter({ !$0.isEmpty }) {
                let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                let bundleID = parts.count == 2 ? parts[1] : parts[0]
                guard !parts[0].isEmpty, bundleIDs.contains(bundleID) || !receiving else {
                    throw ConfigurationError(
                        variable: flag("SIWA_APPLE_CLIENT_IDS"),
                        message: "\(entry): a client ID must be one of SIWA_APPLE_BUNDLE_IDS, or servicesID=bundleID mapping a Services ID to one of them")
                }
                map[parts[0]] = bundleID
            }
            config.clientIDs = map
        }
        config.sessionTTL = try duration("SIWA_SESSION_TTL", default: config.sessionTTL)
        config.historyRetention = try duration("SIWA_HISTORY_RETENTION", default: config.historyRetention)
        if let token = value("SIWA_METRICS_TOKEN") {
            guard token.utf8.count >= 16 else {
                throw ConfigurationError(variable: flag("SIWA_METRICS_TOKEN"), message: "must be at least 16 characters (e.g. openssl rand -hex 16)")
            }
            config.metricsToken = token
        }
        switch (value("SIWA_TLS_CERT_FILE"), value("SIWA_TLS_KEY_FILE")) {
        case (nil, nil): break
        case (let certificate?, let key?):
            for (name, path) in [("SIWA_TLS_CERT_FILE", certificate), ("SIWA_TLS_KEY_FILE", key)] where !FileManager.default.isReadableFile(atPath: path) {
                throw ConfigurationError(variable: flag(name), message: "cannot read \(path)")
            }
            config.tlsCertificateFile = certificate
            config.tlsKeyFile = key
        case (nil, _):
            throw ConfigurationError(variable: flag("SIWA_TLS_CERT_FILE"), message: "is required with SIWA_TLS_KEY_FILE (serving HTTPS needs both)")
        case (_, nil):
            throw ConfigurationError(variable: flag("SIWA_TLS_KEY_FILE"), message: "is required with SIWA_TLS_CERT_FILE (serving HTTPS needs both)")
        }
        config.callbackTimeout = try duration("SIWA_CALLBACK_TIMEOUT", default: config.callbackTimeout)
        config.callbackConcurrency = try integer("SIWA_CALLBACK_CONCURRENCY", 1...256, default: config.callbackConcurrency)
        if config.databaseURL == nil && !config.embeddedDatabase {
            throw ConfigurationError(
                variable: "DATABASE_URL",
                message: "is not set and SIWA_EMBEDDED_DATABASE=off: set DATABASE_URL to your PostgreSQL server, e.g. postgres://siwa:secret@db.internal:5432/siwa")
        }
        return config
    }
}
