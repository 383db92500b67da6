import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaStore

@main
struct SiwaEvents: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "siwa-events",
        abstract: "Receive, verify and record Sign in with Apple server-to-server notifications.",
        subcommands: [
            Serve.self, Migrate.self, NotificationsCommand.self, RejectionsCommand.self, JobsCommand.self, CallbacksCommand.self, AlertsCommand.self, ReplayCommand.self, TokensCommand.self, AccountsCommand.self, AuditCommand.self,
            DatabaseCommand.self, Verify.self, Doctor.self, Healthcheck.self,
            KeysCommand.self, Send.self,
        ])
}

/// Settings shared by every command that touches the database or serves: each flag overrides the
/// environment variable of the same meaning (see `siwa-events serve --help`).
struct ConfigOptions: ParsableArguments {
    @Option(name: .customLong("database-url"), help: "PostgreSQL URL (DATABASE_URL). Default: the embedded cluster.")
    var databaseURL: String?
    @Option(name: .customLong("bundle-ids"), help: "Comma-separated bundle IDs accepted as aud (SIWA_APPLE_BUNDLE_IDS).")
    var bundleIDs: String?
    @Option(name: .customLong("jwks-url"), help: "Apple's key set, https:// or file:// (SIWA_APPLE_JWKS_URL).")
    var jwksURL: String?
    @Option(help: "Listen address (SIWA_HOST, default 127.0.0.1).")
    var host: String?
    @Option(help: "Listen port (SIWA_PORT, default 8080).")
    var port: String?
    @Option(name: .customLong("admin-host"), help: "Admin listener address: API, dashboard, /metrics (SIWA_ADMIN_HOST, default 127.0.0.1).")
    var adminHost: String?
    @Option(name: .customLong("admin-port"), help: "Admin listener port (SIWA_ADMIN_PORT, default 8081).")
    var adminPort: String?
    @Option(name: .customLong("http-request-timeout"), help: "A request's head and body must arrive within this from its first byte, e.g. 30s (SIWA_HTTP_REQUEST_TIMEOUT).")
    var httpRequestTimeout: String?
    @Option(name: .customLong("http-idle-timeout"), help: "Close a connection without a request in progress after this, e.g. 150s (SIWA_HTTP_IDLE_TIMEOUT).")
    var httpIdleTimeout: String?
    @Option(name: .customLong("tls-handshake-timeout"), help: "A TLS handshake must complete within this, e.g. 10s (SIWA_TLS_HANDSHAKE_TIMEOUT).")
    var tlsHandshakeTimeout: String?
    @Option(name: .customLong("http-max-connections"), help: "Open connections per listener at most; one more is closed at once (SIWA_HTTP_MAX_CONNECTIONS, default 1024).")
    var httpMaxConnections: String?
    @Option(name: .customLong("data-dir"), help: "Embedded PostgreSQL data directory (SIWA_DATA_DIR, default ./.siwa).")
    var dataDir: String?
    @Option(name: .customLong("embedded-database"), help: "on|off (SIWA_EMBEDDED_DATABASE, default on).")
    var embeddedDatabase: String?
    @Option(name: .customLong("migrate-on-start"), help: "true|false (SIWA_MIGRATE_ON_START, default true).")
    var migrateOnStart: String?
    @Option(name: .customLong("trusted-proxies"), help: "CIDR list whose X-Forwarded-For is believed (SIWA_TRUSTED_PROXIES).")
    var trustedProxies: String?
    @Option(name: .customLong("jwks-refresh-interval"), help: "Scheduled key refresh, e.g. 1h (SIWA_JWKS_REFRESH_INTERVAL).")
    var jwksRefreshInterval: String?
    @Option(name: .customLong("jwks-unknown-kid-cooldown"), help: "Minimum time between unknown-kid refreshes, e.g. 60s (SIWA_JWKS_UNKNOWN_KID_COOLDOWN).")
    var unknownKidCooldown: String?
    @Option(name: .customLong("clock-skew"), help: "Allowance on exp/iat, e.g. 60s (SIWA_CLOCK_SKEW).")
    var clockSkew: String?
    @Option(name: .customLong("rejections-per-minute"), help: "Rejection rows kept per reason per minute (SIWA_REJECTIONS_PER_MINUTE, default 60).")
    var rejectionsPerMinute: String?
    @Option(name: .customLong("other-app-tokens-per-hour"), help: "Genuine tokens for an unknown bundle ID kept whole per aud per hour (SIWA_OTHER_APP_TOKENS_PER_HOUR, default 20).")
    var otherAppTokensPerHour: String?
    @Option(name: .customLong("other-app-token-retention"), help: "Kept tokens for unknown bundle IDs are deleted after this, e.g. 7d (SIWA_OTHER_APP_TOKEN_RETENTION).")
    var otherAppTokenRetention: String?
    @Option(name: .customLong("database-pool-size"), help: "Maximum PostgreSQL connections (SIWA_DATABASE_POOL_SIZE, default 32).")
    var databasePoolSize: String?
    @Option(name: .customLong("database-timeout"), help: "Longest wait for the database before answering 503, e.g. 5s (SIWA_DATABASE_TIMEOUT).")
    var databaseTimeout: String?
    @Option(name: .customLong("commit-queue-limit"), help: "Notifications waiting for a commit at most; more are answered 503 at once (SIWA_COMMIT_QUEUE_LIMIT, default 4096).")
    var commitQueueLimit: String?
    @Option(name: .customLong("shutdown-grace"), help: "On SIGTERM, how long in-flight requests and batches get to finish, e.g. 20s (SIWA_SHUTDOWN_GRACE).")
    var shutdownGrace: String?
    @Option(name: .customLong("tls-cert-file"), help: "Serve HTTPS: PEM certificate chain, leaf first (SIWA_TLS_CERT_FILE; with --tls-key-file).")
    var tlsCertFile: String?
    @Option(name: .customLong("tls-key-file"), help: "Serve HTTPS: PEM private key (SIWA_TLS_KEY_FILE).")
    var tlsKeyFile: String?
    @Option(help: "all|receiver|worker: what this process runs (SIWA_ROLE, default all).")
    var role: String?
    @Option(help: "Effect worker loops in this process (SIWA_WORKERS, default 4).")
    var workers: String?
    @Option(name: .customLong("job-lease"), help: "Lease of a claimed callback or alert delivery, renewed by heartbeat, e.g. 15s (SIWA_JOB_LEASE).")
    var jobLease: String?
    @Option(name: .customLong("job-max-attempts"), help: "Attempts before a job is discarded (SIWA_JOB_MAX_ATTEMPTS, default 25).")
    var jobMaxAttempts: String?
    @Option(name: .customLong("job-retention"), help: "How long finished jobs are kept, e.g. 7d (SIWA_JOB_RETENTION).")
    var jobRetention: String?
    @Option(name: .customLong("job-poll-interval"), help: "Idle workers look for jobs this often, e.g. 100ms (SIWA_JOB_POLL_INTERVAL).")
    var jobPollInterval: String?
    @Option(name: .customLong("job-notify"), help: "on|off: LISTEN for enqueue notifications (SIWA_JOB_NOTIFY, default on).")
    var jobNotify: String?
    @Option(name: .customLong("erase-on-delete"), help: "true|false: erase a deleted account's email everywhere (SIWA_ERASE_ON_DELETE, default true).")
    var eraseOnDelete: String?
    @Option(name: .customLong("client-ids"), help: "Identity-token aud values for POST /v1/sessions: id or servicesID=bundleID (SIWA_APPLE_CLIENT_IDS).")
    var clientIDs: String?
    @Option(name: .customLong("history-retention"), help: "Notifications and rejections older than this are pruned, e.g. 400d (SIWA_HISTORY_RETENTION).")
    var historyRetention: String?
    @Option(name: .customLong("session-ttl"), help: "Lifetime of a session created without expires_at, e.g. 30d (SIWA_SESSION_TTL).")
    var sessionTTL: String?
    @Option(name: .customLong("metrics-token"), help: "When set, /metrics needs Authorization: Bearer <it> (SIWA_METRICS_TOKEN).")
    var metricsToken: String?
    @Option(name: .customLong("callback-url"), help: "Endpoint POSTed a signed callback after each effect (SIWA_CALLBACK_URL; unset: none).")
    var callbackURL: String?
    @Option(name: .customLong("callback-secret"), help: "Space-separated whsec_ secrets that sign callbacks (SIWA_CALLBACK_SECRET).")
    var callbackSecret: String?
    @Option(name: .customLong("callback-timeout"), help: "One callback attempt's limit, e.g. 10s (SIWA_CALLBACK_TIMEOUT).")
    var callbackTimeout: String?
    @Option(name: .customLong("callback-concurrency"), help: "Callbacks in flight at once (SIWA_CALLBACK_CONCURRENCY, default 16).")
    var callbackConcurrency: String?
    @Option(name: .customLong("spike-interval"), help: "How often alerts are evaluated, e.g. 30s (SIWA_SPIKE_INTERVAL).")
    var spikeInterval: String?
    @Option(name: .customLong("spike-window"), help: "Window compared with the baseline, e.g. 5m (SIWA_SPIKE_WINDOW).")
    var spikeWindow: String?
    @Option(name: .customLong("spike-min-count"), help: "Revocations a spike needs in the window (SIWA_SPIKE_MIN_COUNT, default 20).")
    var spikeMinCount: String?
    @Option(name: .customLong("spike-factor"), help: "Times the baseline a spike needs (SIWA_SPIKE_FACTOR, default 5).")
    var spikeFactor: String?
    @Option(name: .customLong("spike-new-app-count"), help: "Revocations in the window that fire for an app without history (SIWA_SPIKE_NEW_APP_COUNT, default 50).")
    var spikeNewAppCount: String?
    @Option(name: .customLong("spike-resolve-after"), help: "Normal this long resolves an alert, e.g. 15m (SIWA_SPIKE_RESOLVE_AFTER).")
    var spikeResolveAfter: String?
    @Option(name: .customLong("alert-webhook-urls"), help: "Comma-separated URLs POSTed each alert, signed (SIWA_ALERT_WEBHOOK_URLS).")
    var alertWebhookURLs: String?
    @Option(name: .customLong("alert-secret"), help: "Space-separated whsec_ secrets that sign alert webhooks, never a callback secret (SIWA_ALERT_SECRET).")
    var alertSecret: String?
    @Option(name: .customLong("alert-slack-url"), help: "Slack-compatible incoming-webhook URL (SIWA_ALERT_SLACK_URL).")
    var alertSlackURL: String?
    @Option(name: .customLong("alert-queue-lag"), help: "Oldest ready job's wait that fires queue_lag, e.g. 2m (SIWA_ALERT_QUEUE_LAG).")
    var alertQueueLag: String?
    @Option(name: .customLong("alert-bad-signatures"), help: "Bad signatures in the window that fire (SIWA_ALERT_BAD_SIGNATURES, default 20).")
    var alertBadSignatures: String?
    @Option(name: .customLong("alert-discarded-jobs"), help: "Discarded jobs in the window that fire (SIWA_ALERT_DISCARDED_JOBS, default 1).")
    var alertDiscardedJobs: String?
    @Option(name: .customLong("log-level"), help: "trace|debug|info|notice|warning|error|critical (SIWA_LOG_LEVEL; default info for serve, warning otherwise).")
    var logLevel: String?
    @Option(name: .customLong("log-format"), help: "text|json: key=value lines or one JSON object per line (SIWA_LOG_FORMAT, default text).")
    var logFormat: String?

    /// The log flags of the command being run, for `makeLogger` (set by `load`, before any logger).
    nonisolated(unsafe) static var logOverrides: [String: String] = [:]

    func load(requireBundleIDs: Bool) throws -> Configuration {
        let overrides: [String: String?] = [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": bundleIDs, "SIWA_APPLE_JWKS_URL": jwksURL, "SIWA_HOST": host,
            "SIWA_PORT": port, "SIWA_ADMIN_HOST": adminHost, "SIWA_ADMIN_PORT": adminPort, "SIWA_HTTP_REQUEST_TIMEOUT": httpRequestTimeout,
            "SIWA_HTTP_IDLE_TIMEOUT": httpIdleTimeout, "SIWA_TLS_HANDSHAKE_TIMEOUT": tlsHandshakeTimeout, "SIWA_HTTP_MAX_CONNECTIONS": httpMaxConnections,
            "SIWA_DATA_DIR": dataDir, "SIWA_EMBEDDED_DATABASE": embeddedDatabase,
            "SIWA_MIGRATE_ON_START": migrateOnStart, "SIWA_TRUSTED_PROXIES": trustedProxies,
            "SIWA_JWKS_REFRESH_INTERVAL": jwksRefreshInterval, "SIWA_JWKS_UNKNOWN_KID_COOLDOWN": unknownKidCooldown,
            "SIWA_CLOCK_SKEW": clockSkew, "SIWA_REJECTIONS_PER_MINUTE": rejectionsPerMinute,
            "SIWA_OTHER_APP_TOKENS_PER_HOUR": otherAppTokensPerHour, "SIWA_OTHER_APP_TOKEN_RETENTION": otherAppTokenRetention, "SIWA_DATABASE_POOL_SIZE": databasePoolSize,
            "SIWA_DATABASE_TIMEOUT": databaseTimeout, "SIWA_COMMIT_QUEUE_LIMIT": commitQueueLimit, "SIWA_SHUTDOWN_GRACE": shutdownGrace, "SIWA_ROLE": role, "SIWA_WORKERS": workers, "SIWA_JOB_LEASE": jobLease,
            "SIWA_JOB_MAX_ATTEMPTS": jobMaxAttempts, "SIWA_JOB_RETENTION": jobRetention, "SIWA_JOB_POLL_INTERVAL": jobPollInterval,
            "SIWA_JOB_NOTIFY": jobNotify, "SIWA_ERASE_ON_DELETE": eraseOnDelete, "SIWA_CALLBACK_URL": callbackURL,
            "SIWA_CALLBACK_SECRET": callbackSecret, "SIWA_CALLBACK_TIMEOUT": callbackTimeout, "SIWA_CALLBACK_CONCURRENCY": callbackConcurrency,
            "SIWA_APPLE_CLIENT_IDS": clientIDs, "SIWA_SESSION_TTL": sessionTTL, "SIWA_HISTORY_RETENTION": historyRetention, "SIWA_METRICS_TOKEN": metricsToken,
            "SIWA_TLS_CERT_FILE": tlsCertFile, "SIWA_TLS_KEY_FILE": tlsKeyFile,
            "SIWA_SPIKE_INTERVAL": spikeInterval, "SIWA_SPIKE_WINDOW": spikeWindow, "SIWA_SPIKE_MIN_COUNT": spikeMinCount, "SIWA_SPIKE_FACTOR": spikeFactor,
            "SIWA_SPIKE_NEW_APP_COUNT": spikeNewAppCount, "SIWA_SPIKE_RESOLVE_AFTER": spikeResolveAfter, "SIWA_ALERT_WEBHOOK_URLS": alertWebhookURLs, "SIWA_ALERT_SECRET": alertSecret,
            "SIWA_ALERT_SLACK_URL": alertSlackURL, "SIWA_ALERT_QUEUE_LAG": alertQueueLag, "SIWA_ALERT_BAD_SIGNATURES": alertBadSignatures,
            "SIWA_ALERT_DISCARDED_JOBS": alertDiscardedJobs, "SIWA_LOG_LEVEL": logLevel, "SIWA_LOG_FORMAT": logFormat,
        ]
        Self.logOverrides = ["SIWA_LOG_LEVEL": logLevel, "SIWA_LOG_FORMAT": logFormat].compactMapValues { $0 }
        do {
            return try Configuration.load(
                environment: ProcessInfo.processInfo.environment, overrides: overrides.compactMapValues { $0 }, requireBundleIDs: requireBundleIDs)
        } catch {
            printError("siwa-events: \(error.description)")
            throw ExitCode(78)  // EX_CONFIG
        }
    }
}

/// One logger for the process: structured lines on stderr, level and format from SIWA_LOG_LEVEL and
/// SIWA_LOG_FORMAT (default level `info` for `serve`, `warning` for one-shot commands, whose output
/// is their result). A bad value stops the command (exit 78) naming the variable.
func makeLogger(_ label: String = "siwa-events", defaultLevel: Logger.Level = .warning) throws -> Logger {
    let settings: (level: Logger.Level?, format: LogFormat)
    do {
        settings = try Configuration.logging(environment: ProcessInfo.processInfo.environment, overrides: ConfigOptions.logOverrides)
    } catch {
        printError("siwa-events: \(error.description)")
        throw ExitCode(78)  // EX_CONFIG
    }
    let level = settings.level ?? defaultLevel
    LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: settings.format) }
    return Logger(label: label)
}

/// Prints to stderr (progress and diagnostics; stdout is for results).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the receiver (embedded PostgreSQL unless DATABASE_URL is set).")
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        let config = try options.load(requireBundleIDs: true)
        do {
            try await Server.serve(config, logger: try makeLogger(defaultLevel: .info))
        } catch let error as ConfigurationError {
            // Found only when opening the database (DATABASE_URL unusable, or missing with
            // SIWA_EMBEDDED_DATABASE=off): a configuration error all the same.
            printError("siwa-events: \(error.description)")
            throw ExitCode(78)  // EX_CONFIG
        }
    }
}

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Apply pending database migrations from sql/ (built in).")
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        let config = try options.load(requireBundleIDs: false)
        let logger = try makeLogger()
        let applied = try await Database.with(config, logger: logger) { database in
            try await Migrator(client: database.client, logger: logger).migrate()
        }
        print(applied.isEmpty ? "schema is up to date" : "applied migrations: \(applied.map(String.init).joined(separator: ", "))")
    }
}
