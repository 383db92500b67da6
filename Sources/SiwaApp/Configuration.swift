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

/// Every setting of the service, validated once at the edge: one value per group of settings
/// (`config.http.port`, `config.jobs.lease`, …), each read from its flag or environment variable
/// (`Settings.swift`); a bad value stops start-up with a message naming it.
package struct Configuration: Sendable {
    package static let appleJWKSURL = URL(string: "https://appleid.apple.com/auth/keys")!

    package enum Role: String, Sendable, CaseIterable { case all, receiver, worker }
    /// What this process runs.
    package var role = Settings.role.defaultValue
    /// SIGTERM/SIGINT: how long in-flight requests and the workers' batches get to finish before
    /// what is left is cancelled (a second signal cancels at once).
    package var shutdownGrace = Settings.shutdownGrace.defaultValue
    package var database = DatabaseSettings()
    package var apple: AppleSettings
    package var http = HTTPSettings()
    package var history = HistorySettings()
    package var jobs = JobSettings()
    package var accounts = AccountSettings()
    package var callbacks = CallbackSettings()
    package var alerts = AlertSettings()
    package var logging = LogSettings()

    /// The receiving process's HTTP routes and key cache are needed (roles all, receiver).
    package var receives: Bool { role != .worker }
    /// This process runs effect workers (roles all, worker).
    package var works: Bool { role != .receiver }

    package init(bundleIDs: [String]) {
        self.apple = AppleSettings(bundleIDs: bundleIDs)
    }

    /// `DATABASE_URL` or the embedded cluster, and the pool.
    package struct DatabaseSettings: Sendable {
        package var url: String?
        package var embedded = Settings.embeddedDatabase.defaultValue
        package var dataDirectory = Settings.dataDirectory.defaultValue
        /// The embedded cluster's PostgreSQL binaries (nil: the newest installed).
        package var postgresBinaries: String?
        package var poolSize = Settings.databasePoolSize.defaultValue
        package var timeout = Settings.databaseTimeout.defaultValue
        package var migrateOnStart = Settings.migrateOnStart.defaultValue
    }

    /// What Apple's notifications and identity tokens are checked against.
    package struct AppleSettings: Sendable {
        package var bundleIDs: [String]
        package var jwksURL = Settings.jwksURL.defaultValue
        package var jwksRefreshInterval = Settings.jwksRefreshInterval.defaultValue
        package var unknownKidCooldown = Settings.unknownKidCooldown.defaultValue
        package var jwksMaximumAge = Settings.jwksMaximumAge.defaultValue
        package var clockSkew = Settings.clockSkew.defaultValue
        /// Identity-token client IDs → the bundle ID whose accounts they sign in to.
        package var clientIDs: [String: String]

        package init(bundleIDs: [String]) {
            self.bundleIDs = bundleIDs
            self.clientIDs = Dictionary(bundleIDs.map { ($0, $0) }, uniquingKeysWith: { first, _ in first })
        }
    }

    /// The two listeners: the public one (`host`, `port`) and the admin one (API, dashboard,
    /// /openapi.yaml, /metrics).
    package struct HTTPSettings: Sendable {
        package var host = Settings.host.defaultValue
        package var port = Settings.port.defaultValue
        package var adminHost = Settings.adminHost.defaultValue
        package var adminPort = Settings.adminPort.defaultValue
        package var limits = ConnectionLimits()
        /// Serve HTTPS directly (PEM files: the certificate chain, leaf first, and its private key).
        /// Without them: plain HTTP behind a TLS-terminating proxy.
        package var tlsCertificateFile: String?
        package var tlsKeyFile: String?
        package var trustedProxies = Settings.trustedProxies.defaultValue
        package var adminHosts = Settings.adminHosts.defaultValue
        package var metricsToken: String?
        package var commitQueueLimit = Settings.commitQueueLimit.defaultValue
    }

    /// Rejections kept, and how long history stays.
    package struct HistorySettings: Sendable {
        package var rejectionsPerMinute = Settings.rejectionsPerMinute.defaultValue
        /// Genuine tokens for another bundle ID kept whole, per `aud` per hour.
        package var otherAppTokensPerHour = Settings.otherAppTokensPerHour.defaultValue
        /// How long such a kept token stays (enough to replay after fixing a bundle-ID typo).
        package var otherAppTokenRetention = Settings.otherAppTokenRetention.defaultValue
        package var retention = Settings.historyRetention.defaultValue
    }

    /// The job queue and the effect workers.
    package struct JobSettings: Sendable {
        package var workers = Settings.workers.defaultValue
        package var lease = Settings.jobLease.defaultValue
        package var maxAttempts = Settings.jobMaxAttempts.defaultValue
        package var retention = Settings.jobRetention.defaultValue
        package var pollInterval = Settings.jobPollInterval.defaultValue
        package var notify = Settings.jobNotify.defaultValue
    }

    /// What effects do to accounts, and sessions' lifetime.
    package struct AccountSettings: Sendable {
        package var eraseOnDelete = Settings.eraseOnDelete.defaultValue
        package var sessionTTL = Settings.sessionTTL.defaultValue
    }

    /// Callbacks to the backend: none without a URL.
    package struct CallbackSettings: Sendable {
        package var url: URL?
        package var signer: WebhookSigner?
        package var timeout = Settings.callbackTimeout.defaultValue
        package var concurrency = Settings.callbackConcurrency.defaultValue
    }

    /// The alert rules and where alerts go.
    package struct AlertSettings: Sendable {
        package var spike = SpikeSettings()
        package var webhooks: [URL] = []
        /// Signs alert webhooks: a secret of its own, so whoever verifies alerts cannot forge callbacks.
        package var signer: WebhookSigner?
        package var slackURL: URL?
        package var queueLag = Settings.alertQueueLag.defaultValue
        package var badSignatures = Settings.alertBadSignatures.defaultValue
        package var discardedJobs = Settings.alertDiscardedJobs.defaultValue
    }

    package struct LogSettings: Sendable {
        /// nil: the command's own default (`info` for `serve`, `warning` for one-shot commands).
        package var level: Logger.Level?
        package var format = Settings.logFormat.defaultValue
    }

    /// The logging settings alone (every command reads them, also those that read nothing else).
    package static func logging(_ source: SettingSource) throws(ConfigurationError) -> LogSettings {
        LogSettings(level: try source.value(Settings.logLevel), format: try source.value(Settings.logFormat))
    }

    /// Builds the configuration from `environment`, with `overrides` (values keyed by variable
    /// name) taking precedence. `requireBundleIDs` is true for commands that receive notifications.
    package static func load(environment: [String: String], overrides: [String: String] = [:], requireBundleIDs: Bool) throws(ConfigurationError) -> Configuration {
        try load(try SettingSource(environment: environment, overrides: overrides), requireBundleIDs: requireBundleIDs)
    }

    /// Builds the configuration from `source`: every setting is read and checked, also those the
    /// command does not use, so a bad value is found by whichever command runs first.
    package static func load(_ source: SettingSource, requireBundleIDs: Bool) throws(ConfigurationError) -> Configuration {
        func value<Value>(_ setting: Setting<Value>) throws(ConfigurationError) -> Value { try source.value(setting) }
        func text<Value>(_ setting: Setting<Value>) -> String? { source.text(setting.info) }
        func name<Value>(_ setting: Setting<Value>) -> String { setting.info.name }

        let bundleIDs = try value(Settings.bundleIDs)
        let receiving = (text(Settings.role)?.lowercased() ?? "all") != "worker"
        if requireBundleIDs && receiving && bundleIDs.isEmpty {
            throw ConfigurationError(
                variable: name(Settings.bundleIDs),
                message: "is required: the comma-separated bundle IDs of your apps (Apple's aud), e.g. SIWA_APPLE_BUNDLE_IDS=com.example.app")
        }
        var config = Configuration(bundleIDs: bundleIDs)
        config.logging = try logging(source)
        config.database.url = try value(Settings.databaseURL)
        config.apple.jwksURL = try value(Settings.jwksURL)
        config.http.host = try value(Settings.host)
        config.http.port = try value(Settings.port)
        config.http.adminHost = try value(Settings.adminHost)
        config.http.adminPort = try value(Settings.adminPort)
        if config.http.adminPort == config.http.port && config.http.port != 0 && config.http.adminHost == config.http.host {
            throw ConfigurationError(
                variable: name(Settings.adminPort), message: "must differ from SIWA_PORT (\(config.http.port)): the admin listener is a second one")
        }
        config.http.limits.requestTimeout = try value(Settings.httpRequestTimeout)
        config.http.limits.idleTimeout = try value(Settings.httpIdleTimeout)
        config.http.limits.firstRequestTimeout = try value(Settings.httpFirstRequestTimeout)
        config.http.limits.tlsHandshakeTimeout = try value(Settings.tlsHandshakeTimeout)
        config.http.limits.maximumConnections = try value(Settings.httpMaxConnections)
        config.database.dataDirectory = try value(Settings.dataDirectory)
        config.database.postgresBinaries = try value(Settings.postgresBinaries)
        config.database.embedded = try value(Settings.embeddedDatabase)
        config.database.migrateOnStart = try value(Settings.migrateOnStart)
        config.http.trustedProxies = try value(Settings.trustedProxies)
        config.http.adminHosts = try value(Settings.adminHosts)
        config.apple.jwksRefreshInterval = try value(Settings.jwksRefreshInterval)
        config.apple.unknownKidCooldown = try value(Settings.unknownKidCooldown)
        config.apple.jwksMaximumAge = try value(Settings.jwksMaximumAge)
        config.apple.clockSkew = try value(Settings.clockSkew)
        config.history.rejectionsPerMinute = try value(Settings.rejectionsPerMinute)
        config.history.otherAppTokensPerHour = try value(Settings.otherAppTokensPerHour)
        config.history.otherAppTokenRetention = try value(Settings.otherAppTokenRetention)
        config.database.poolSize = try value(Settings.databasePoolSize)
        config.database.timeout = try value(Settings.databaseTimeout)
        config.http.commitQueueLimit = try value(Settings.commitQueueLimit)
        config.shutdownGrace = try value(Settings.shutdownGrace)
        config.role = try value(Settings.role)
        config.jobs.workers = try value(Settings.workers)
        config.jobs.lease = try value(Settings.jobLease)
        config.jobs.maxAttempts = try value(Settings.jobMaxAttempts)
        config.jobs.retention = try value(Settings.jobRetention)
        config.jobs.pollInterval = try value(Settings.jobPollInterval)
        config.jobs.notify = try value(Settings.jobNotify)
        config.accounts.eraseOnDelete = try value(Settings.eraseOnDelete)
        func secretList<Value>(_ setting: Setting<Value>) -> [Substring] {
            (text(setting) ?? "").split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
        }
        func httpURL<Value>(_ setting: Setting<Value>, _ text: String) throws(ConfigurationError) -> URL {
            guard let url = URL(string: text), ["https", "http"].contains(url.scheme?.lowercased() ?? ""), url.host?.isEmpty == false else {
                throw ConfigurationError(variable: name(setting), message: "must be an https:// or http:// URL (got \"\(text)\")")
            }
            return url
        }
        /// The secrets in `setting`, required because `user` (a variable) sends signed messages.
        func signer(_ setting: Setting<String?>, for user: String, _ what: String) throws(ConfigurationError) -> WebhookSigner {
            guard let secrets = text(setting) else {
                throw ConfigurationError(
                    variable: name(setting),
                    message: "is required when \(user) is set: \(what); create one with `siwa-events callbacks secret`")
            }
            do {
                return try WebhookSigner(secrets: secrets)
            } catch {
                throw ConfigurationError(variable: name(setting), message: error.description)
            }
        }
        if let text = text(Settings.callbackURL) {
            let url = try httpURL(Settings.callbackURL, text)
            config.callbacks.signer = try signer(Settings.callbackSecret, for: "SIWA_CALLBACK_URL", "callbacks are always signed")
            config.callbacks.url = url
        } else if text(Settings.callbackSecret) != nil {
            throw ConfigurationError(
                variable: name(Settings.callbackURL),
                message: "is not set, but SIWA_CALLBACK_SECRET is: set the URL callbacks go to, or unset the secret (alert webhooks use SIWA_ALERT_SECRET)")
        }
        if let text = text(Settings.alertWebhookURLs) {
            for part in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).filter({ !$0.isEmpty }) {
                config.alerts.webhooks.append(try httpURL(Settings.alertWebhookURLs, part))
            }
            config.alerts.signer = try signer(
                Settings.alertSecret, for: "SIWA_ALERT_WEBHOOK_URLS",
                "alert webhooks are signed with a secret of their own, never the callback secret")
            let shared = Set(secretList(Settings.alertSecret)).intersection(secretList(Settings.callbackSecret))
            guard shared.isEmpty else {
                throw ConfigurationError(
                    variable: name(Settings.alertSecret),
                    message: "must differ from every SIWA_CALLBACK_SECRET: whoever verifies alert webhooks could otherwise sign callbacks to your backend; create one with `siwa-events callbacks secret`")
            }
        } else if text(Settings.alertSecret) != nil {
            throw ConfigurationError(
                variable: name(Settings.alertWebhookURLs), message: "is not set, but SIWA_ALERT_SECRET is: set the alert webhook URLs, or unset the secret")
        }
        if let text = text(Settings.alertSlackURL) { config.alerts.slackURL = try httpURL(Settings.alertSlackURL, text) }
        config.alerts.spike.interval = try value(Settings.spikeInterval)
        config.alerts.spike.window = try value(Settings.spikeWindow)
        config.alerts.spike.resolveAfter = try value(Settings.spikeResolveAfter)
        config.alerts.spike.minCount = try value(Settings.spikeMinCount)
        config.alerts.spike.newAppCount = try value(Settings.spikeNewAppCount)
        config.alerts.spike.factor = try value(Settings.spikeFactor)
        config.alerts.queueLag = try value(Settings.alertQueueLag)
        config.alerts.badSignatures = try value(Settings.alertBadSignatures)
        config.alerts.discardedJobs = try value(Settings.alertDiscardedJobs)
        if let text = text(Settings.clientIDs) {
            var map: [String: String] = [:]
            for entry in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).filter({ !$0.isEmpty }) {
                let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                let bundleID = parts.count == 2 ? parts[1] : parts[0]
                guard !parts[0].isEmpty, bundleIDs.contains(bundleID) || !receiving else {
                    throw ConfigurationError(
                        variable: name(Settings.clientIDs),
                        message: "\(entry): a client ID must be one of SIWA_APPLE_BUNDLE_IDS, or servicesID=bundleID mapping a Services ID to one of them")
                }
                map[parts[0]] = bundleID
            }
            config.apple.clientIDs = map
        }
        config.accounts.sessionTTL = try value(Settings.sessionTTL)
        config.history.retention = try value(Settings.historyRetention)
        config.http.metricsToken = try value(Settings.metricsToken)
        switch (text(Settings.tlsCertificateFile), text(Settings.tlsKeyFile)) {
        case (nil, nil): break
        case (let certificate?, let key?):
            for (setting, path) in [(Settings.tlsCertificateFile, certificate), (Settings.tlsKeyFile, key)] where !FileManager.default.isReadableFile(atPath: path) {
                throw ConfigurationError(variable: name(setting), message: "cannot read \(path)")
            }
            config.http.tlsCertificateFile = certificate
            config.http.tlsKeyFile = key
        case (nil, _):
            throw ConfigurationError(variable: name(Settings.tlsCertificateFile), message: "is required with SIWA_TLS_KEY_FILE (serving HTTPS needs both)")
        case (_, nil):
            throw ConfigurationError(variable: name(Settings.tlsKeyFile), message: "is required with SIWA_TLS_CERT_FILE (serving HTTPS needs both)")
        }
        config.callbacks.timeout = try value(Settings.callbackTimeout)
        config.callbacks.concurrency = try value(Settings.callbackConcurrency)
        if config.database.url == nil && !config.database.embedded {
            throw ConfigurationError(
                variable: "DATABASE_URL",
                message: "is not set and SIWA_EMBEDDED_DATABASE=off: set DATABASE_URL to your PostgreSQL server, e.g. postgres://siwa:secret@db.internal:5432/siwa")
        }
        return config
    }
}
