import Foundation
import Logging
import SiwaDomain
import SiwaHTTP
import SiwaStore

/// Every setting of siwa-events, each defined once. `all` is the order of `--help` and the README's
/// configuration table (a test holds the README to it).
package enum Settings {
    // MARK: Database
    package static let databaseURL = Setting<String?>.optionalText(
        "DATABASE_URL", flag: "database-url", .database, shown: "embedded cluster",
        help: "PostgreSQL URL; without it the embedded cluster under SIWA_DATA_DIR is used",
        docs: "`postgres://user:password@host:5432/db?sslmode=disable\\|prefer\\|require`, or `postgres://user@/db?host=/run/postgresql` for a unix socket.",
        secret: true)
    package static let embeddedDatabase = Setting<Bool>.boolean(
        "SIWA_EMBEDDED_DATABASE", flag: "embedded-database", .database, default: true, shownAs: ("on", "off"),
        help: "on|off: may a missing DATABASE_URL start the embedded cluster",
        docs: "`off` turns a missing `DATABASE_URL` into a start-up error (deployments: never \"each replica has its own database\").")
    package static let dataDirectory = Setting<String>.text(
        "SIWA_DATA_DIR", flag: "data-dir", .database, default: "./.siwa",
        help: "where the embedded PostgreSQL keeps its data",
        docs: "Where the embedded cluster keeps its data.")
    package static let postgresBinaries = Setting<String?>.optionalText(
        "SIWA_POSTGRES_BIN", flag: "postgres-bin", .database, shown: "newest `/usr/lib/postgresql/*/bin`",
        help: "PostgreSQL server binaries for the embedded cluster (else initdb on PATH)",
        docs: "PostgreSQL server binaries for the embedded cluster.")
    package static let databasePoolSize = Setting<Int>.integer(
        "SIWA_DATABASE_POOL_SIZE", flag: "database-pool-size", .database, default: 32, 1...1000,
        help: "maximum PostgreSQL connections",
        docs: "PostgreSQL connections of a `serve` process at most (opened as load needs them, closed after 5 s unused); 8-16 is plenty per role.")
    package static let databaseTimeout = Setting<Duration>.duration(
        "SIWA_DATABASE_TIMEOUT", flag: "database-timeout", .database, default: .seconds(5),
        help: "longest wait for the database before answering 503",
        docs: "Longest wait for the database before answering 503.")
    package static let migrateOnStart = Setting<Bool>.boolean(
        "SIWA_MIGRATE_ON_START", flag: "migrate-on-start", .database, default: true, shownAs: ("true", "false"),
        help: "true|false: apply pending migrations when serving",
        docs: "Apply pending migrations on `serve`; with `false`, `serve` refuses to start while the schema is behind and says to run `siwa-events migrate`.")

    // MARK: Apple
    package static let bundleIDs = Setting<[String]>(
        "SIWA_APPLE_BUNDLE_IDS", flag: "bundle-ids", .apple, default: [], shown: "— (required to serve)",
        help: "comma-separated bundle IDs accepted as aud (required to serve)",
        docs: "Comma-separated bundle IDs accepted as `aud`: the primary App ID of each app group (not a Services ID)."
    ) { text throws(SettingValueError) in
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
    package static let jwksURL = Setting<URL>(
        "SIWA_APPLE_JWKS_URL", flag: "jwks-url", .apple, default: Configuration.appleJWKSURL, shown: "`\(Configuration.appleJWKSURL.absoluteString)`",
        help: "Apple's key set (https://, or file://)",
        docs: "Apple's key set; `file://` accepted (local keys); `http://` only to a loopback address (tests)."
    ) { text throws(SettingValueError) in
        guard let url = URL(string: text), ["https", "http", "file"].contains(url.scheme?.lowercased() ?? "") else {
            throw SettingValueError("must be an https:// or file:// URL (got \"\(URLRedaction.scrubbed(text))\")")
        }
        if url.scheme?.lowercased() == "http" && !KeySetRedirect.isLoopback(url) {
            throw SettingValueError("is plain http:// to a non-loopback host (\(URLRedaction.redacted(url))): use https:// (a network attacker could serve its own keys), or file:// for local keys")
        }
        return url
    }
    package static let jwksMaximumAge = Setting<Duration>.duration(
        "SIWA_JWKS_MAX_AGE", flag: "jwks-max-age", .apple, default: .seconds(72 * 3600), minimum: .seconds(3600),
        help: "readiness fails when the key set in use is older (Apple unreachable)",
        docs: "While Apple is unreachable the last fetched (or stored) key set keeps verifying; past this age readiness fails and the log says why.")
    package static let jwksRefreshInterval = Setting<Duration>.duration(
        "SIWA_JWKS_REFRESH_INTERVAL", flag: "jwks-refresh-interval", .apple, default: .seconds(3600),
        help: "scheduled key set refresh",
        docs: "Scheduled key-set refresh (every 15 s while none is loaded).")
    package static let unknownKidCooldown = Setting<Duration>.duration(
        "SIWA_JWKS_UNKNOWN_KID_COOLDOWN", flag: "jwks-unknown-kid-cooldown", .apple, default: .seconds(60),
        help: "minimum time between unknown-kid refreshes",
        docs: "Minimum time between refreshes triggered by unknown `kid`s.")
    package static let clockSkew = Setting<Duration>.duration(
        "SIWA_CLOCK_SKEW", flag: "clock-skew", .apple, default: .seconds(60),
        help: "allowance on exp/iat",
        docs: "Allowance on `exp`, `iat`, `nbf`.")
    package static let clientIDs = Setting<String?>.optionalText(
        "SIWA_APPLE_CLIENT_IDS", flag: "client-ids", .apple, shown: "the bundle IDs",
        help: "identity-token aud values accepted by POST /v1/sessions: id or servicesID=bundleID",
        docs: "`aud` values accepted in identity tokens by `POST /v1/sessions`: a bundle ID, or `servicesID=bundleID` for a web sign-in's Services ID (its users' accounts live under the bundle ID).")

    // MARK: Listeners
    package static let host = Setting<String>.text(
        "SIWA_HOST", flag: "host", .listeners, default: "127.0.0.1",
        help: "address to listen on",
        docs: "Address of the public listener: `POST /apple/notifications` and `/health/*`, nothing else. The only one to expose to the internet (through your TLS proxy).")
    package static let port = Setting<Int>.integer(
        "SIWA_PORT", flag: "port", .listeners, default: 8080, 0...65535,
        help: "port to listen on",
        docs: "Port of the public listener.")
    package static let adminHost = Setting<String>.text(
        "SIWA_ADMIN_HOST", flag: "admin-host", .listeners, default: "127.0.0.1",
        help: "address of the admin listener (API, dashboard, /metrics)",
        docs: "Address of the admin listener: `/v1`, the dashboard, `/openapi.yaml`, `/metrics` (and `/health/*`). Keep it on loopback or a private network (SSH tunnel, VPN, `kubectl port-forward`); never route it from the internet.")
    package static let adminHosts = Setting<[String]>(
        "SIWA_ADMIN_HOSTS", flag: "admin-hosts", .listeners, default: ["localhost"], shown: "`localhost`",
        help: "host names the admin listener answers to, besides IP addresses",
        docs: "Comma-separated host names the admin listener answers to (as `Host`), besides any IP address: a request for another name gets 421, so a web page cannot reach the admin listener through DNS rebinding. Add the names Prometheus or your tunnel use (e.g. `siwa-events-admin`)."
    ) { text throws(SettingValueError) in
        let names = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        for name in names where name.range(of: "^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$", options: .regularExpression) == nil {
            throw SettingValueError("must be comma-separated host names such as localhost,siwa-events-admin (got \"\(name)\")")
        }
        return names
    }
    package static let adminPort = Setting<Int>.integer(
        "SIWA_ADMIN_PORT", flag: "admin-port", .listeners, default: 8081, 0...65535,
        help: "port of the admin listener",
        docs: "Port of the admin listener; must differ from `SIWA_PORT`.")
    package static let httpRequestTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_REQUEST_TIMEOUT", flag: "http-request-timeout", .listeners, default: ConnectionLimits().requestTimeout, minimum: .seconds(1),
        help: "a request's head and body must arrive within this from its first byte",
        docs: "A request's head and body must arrive within this from its first byte; a slower client's connection is closed (an idle timeout alone restarts on every byte).")
    package static let httpIdleTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_IDLE_TIMEOUT", flag: "http-idle-timeout", .listeners, default: ConnectionLimits().idleTimeout, minimum: .seconds(1),
        help: "a connection without a request in progress is closed after this",
        docs: "A connection without a request in progress is closed after this. Longer than the upstream keep-alive of nginx (`keepalive_timeout` 60s) and Caddy (2m), so a proxy never reuses a connection being closed.")
    package static let httpFirstRequestTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_FIRST_REQUEST_TIMEOUT", flag: "http-first-request-timeout", .listeners, default: ConnectionLimits().firstRequestTimeout,
        minimum: .seconds(1),
        help: "a new connection must start its first request within this",
        docs: "A new connection (its TLS handshake done, when serving TLS) must start its first request within this, or it is closed and counted in `siwa_connections_closed_total{reason=\"first_request_timeout\"}`: a client that connects and says nothing holds a place this long, not `SIWA_HTTP_IDLE_TIMEOUT`.")
    package static let tlsHandshakeTimeout = Setting<Duration>.duration(
        "SIWA_TLS_HANDSHAKE_TIMEOUT", flag: "tls-handshake-timeout", .listeners, default: ConnectionLimits().tlsHandshakeTimeout, minimum: .seconds(1),
        help: "a TLS handshake must complete within this (with SIWA_TLS_CERT_FILE)",
        docs: "With `SIWA_TLS_CERT_FILE`: a TLS handshake must complete within this.")
    package static let httpMaxConnections = Setting<Int>.integer(
        "SIWA_HTTP_MAX_CONNECTIONS", flag: "http-max-connections", .listeners, default: ConnectionLimits().maximumConnections, 1...1_000_000,
        help: "open connections per listener at most; one more replaces the longest-idle",
        docs: "Open connections per listener at most (about 34 KiB each). One more takes the place of the longest-idle connection (no request in progress: before its first or between requests; `siwa_connections_closed_total{reason=\"idle_evicted\"}`); only when every one has a request in progress is it closed at once (`reason=\"over_capacity\"`).")
    package static let tlsCertificateFile = Setting<String?>.optionalText(
        "SIWA_TLS_CERT_FILE", flag: "tls-cert-file", .listeners, shown: "none",
        help: "serve HTTPS: PEM certificate chain, leaf first (with SIWA_TLS_KEY_FILE)",
        docs: "Serve HTTPS (TLS 1.2+) directly: PEM certificate chain (leaf first), with `SIWA_TLS_KEY_FILE`. Without them, plain HTTP behind a TLS proxy (deploy/tls/). Certificates are read at start: restart after renewal.")
    package static let tlsKeyFile = Setting<String?>.optionalText(
        "SIWA_TLS_KEY_FILE", flag: "tls-key-file", .listeners, shown: "none",
        help: "serve HTTPS: PEM private key of the certificate",
        docs: "Serve HTTPS: the PEM private key of `SIWA_TLS_CERT_FILE`.")
    package static let trustedProxies = Setting<TrustedProxies>(
        "SIWA_TRUSTED_PROXIES", flag: "trusted-proxies", .listeners, default: .none, shown: "none",
        help: "CIDR list whose X-Forwarded-For is believed",
        docs: "CIDR list; `X-Forwarded-For` is believed only from these peers."
    ) { text throws(SettingValueError) in
        do { return try TrustedProxies(parsing: text) } catch { throw SettingValueError(String(describing: error)) }
    }
    package static let metricsToken = Setting<String?>(
        "SIWA_METRICS_TOKEN", flag: "metrics-token", .listeners, default: nil, shown: "none",
        help: "when set, /metrics needs Authorization: Bearer <it>",
        docs: "When set (16+ characters), `/metrics` (on the admin listener) also needs `Authorization: Bearer <it>`.", secret: true
    ) { token throws(SettingValueError) in
        guard token.utf8.count >= 16 else { throw SettingValueError("must be at least 16 characters (e.g. openssl rand -hex 16)") }
        return token
    }
    package static let commitQueueLimit = Setting<Int>.integer(
        "SIWA_COMMIT_QUEUE_LIMIT", flag: "commit-queue-limit", .listeners, default: GroupCommitter.defaultMaximumQueued, 1...1_000_000,
        help: "notifications waiting for a commit at most; more are answered 503 at once",
        docs: "Notifications waiting for a commit at most (each commit takes every notification waiting, up to 512). One more is answered 503 at once, so while PostgreSQL is slower than the arrivals the receiver's memory stays bounded and Apple hears \"retry\" without waiting out the timeout.")

    // MARK: Process
    package static let role = Setting<Configuration.Role>.choice(
        "SIWA_ROLE", flag: "role", .process, default: .all, shown: "`all`", expected: "all, receiver or worker",
        help: "all|receiver|worker: what this process runs",
        docs: "`all`, `receiver` or `worker`: what this process runs.")
    package static let shutdownGrace = Setting<Duration>.duration(
        "SIWA_SHUTDOWN_GRACE", flag: "shutdown-grace", .process, default: .seconds(20),
        help: "on SIGTERM, how long in-flight requests and deliveries get to finish",
        docs: "On SIGTERM/SIGINT: stop accepting connections, let in-flight requests and deliveries finish this long, hand back held deliveries, exit 0 (an effect batch still running is abandoned: it commits or rolls back whole, and a rolled-back one is applied after the restart); what is still running then is cancelled (exit 1). Keep it under your orchestrator's kill timeout.")

    // MARK: History and rejections
    package static let rejectionsPerMinute = Setting<Int>.integer(
        "SIWA_REJECTIONS_PER_MINUTE", flag: "rejections-per-minute", .history, default: 60, 0...1_000_000,
        help: "rejection rows kept per reason per minute",
        docs: "Rejection rows kept per reason per minute; the rest are counted only.")
    package static let otherAppTokensPerHour = Setting<Int>.integer(
        "SIWA_OTHER_APP_TOKENS_PER_HOUR", flag: "other-app-tokens-per-hour", .history, default: 20, 0...1_000_000,
        help: "genuine tokens for an unknown bundle ID kept whole, per aud per hour (the rest counted)",
        docs: "Genuine (Apple-signed) notifications for a bundle ID that is not yours are kept whole, for `rejections replay` after a bundle-ID typo is fixed, at most this many per `aud` per hour; the rest are recorded without the token (sampled like any rejection). Apple signs every app's notifications with the same keys, so anyone can post their own app's here.")
    package static let otherAppTokenRetention = Setting<Duration>.duration(
        "SIWA_OTHER_APP_TOKEN_RETENTION", flag: "other-app-token-retention", .history, default: .seconds(7 * 86_400), minimum: .seconds(1),
        help: "kept tokens for unknown bundle IDs are deleted after this",
        docs: "Such a kept token (it holds the other app's user's address) is deleted after this; the rejection row stays.")
    package static let historyRetention = Setting<Duration>.duration(
        "SIWA_HISTORY_RETENTION", flag: "history-retention", .history, default: .seconds(400 * 86_400),
        help: "notifications and rejections older than this are pruned",
        docs: "Notifications (with their jobs and attempts) and rejections older than this are pruned in the background, 1,000 rows per statement.")

    // MARK: Jobs and workers
    package static let workers = Setting<Int>.integer(
        "SIWA_WORKERS", flag: "workers", .jobs, default: 4, 1...64,
        help: "effect worker loops in this process",
        docs: "Effect worker loops in this process.")
    package static let jobLease = Setting<Duration>.duration(
        "SIWA_JOB_LEASE", flag: "job-lease", .jobs, default: EffectStore.defaultLease,
        help: "how long a claimed delivery stays held without a heartbeat, and an effect batch may sit idle",
        docs: "How long a claimed callback or alert delivery stays held without a heartbeat; and how long an effect batch's transaction may sit idle before PostgreSQL ends it (a stalled worker frees its jobs).")
    package static let jobMaxAttempts = Setting<Int>.integer(
        "SIWA_JOB_MAX_ATTEMPTS", flag: "job-max-attempts", .jobs, default: 25, 1...1000,
        help: "attempts before a job is discarded",
        docs: "Attempts before a job is `discarded`.")
    package static let jobRetention = Setting<Duration>.duration(
        "SIWA_JOB_RETENTION", flag: "job-retention", .jobs, default: .seconds(7 * 86_400),
        help: "how long finished jobs are kept",
        docs: "How long finished jobs are kept (attempts are kept in `job_attempts`).")
    package static let jobPollInterval = Setting<Duration>.duration(
        "SIWA_JOB_POLL_INTERVAL", flag: "job-poll-interval", .jobs, default: .milliseconds(100),
        help: "idle workers look for jobs this often (NOTIFY wakes them sooner)",
        docs: "Idle workers look for jobs this often; NOTIFY wakes them sooner.")
    package static let jobNotify = Setting<Bool>.boolean(
        "SIWA_JOB_NOTIFY", flag: "job-notify", .jobs, default: true, shownAs: ("on", "off"),
        help: "on|off: LISTEN for enqueue notifications",
        docs: "`off`: poll only (e.g. behind a transaction-mode pooler).")

    // MARK: Accounts and sessions
    package static let eraseOnDelete = Setting<Bool>.boolean(
        "SIWA_ERASE_ON_DELETE", flag: "erase-on-delete", .accounts, default: true, shownAs: ("true", "false"),
        help: "true|false: erase a deleted account's email everywhere",
        docs: "Erase a deleted account's email everywhere.")
    package static let sessionTTL = Setting<Duration>.duration(
        "SIWA_SESSION_TTL", flag: "session-ttl", .accounts, default: .seconds(30 * 86_400),
        help: "lifetime of a session created without expires_at",
        docs: "Lifetime of a session created without `expires_at`.")

    // MARK: Callbacks
    package static let callbackURL = Setting<String?>.optionalText(
        "SIWA_CALLBACK_URL", flag: "callback-url", .callbacks, shown: "none",
        help: "http(s) endpoint POSTed a signed callback after each effect (unset: none)",
        docs: "`https://` (or `http://`) endpoint of your backend, POSTed a signed callback after each effect (see [docs/reference.md, \"Callbacks\"](docs/reference.md#callbacks)).")
    package static let callbackSecret = Setting<String?>.optionalText(
        "SIWA_CALLBACK_SECRET", flag: "callback-secret", .callbacks, shown: "— (required with a URL)",
        help: "space-separated whsec_ secrets that sign callbacks (all sign: rotation)",
        docs: "One or more space-separated `whsec_…` secrets; every one signs (rotation). `siwa-events callbacks secret` makes one.",
        secret: true)
    package static let callbackTimeout = Setting<Duration>.duration(
        "SIWA_CALLBACK_TIMEOUT", flag: "callback-timeout", .callbacks, default: .seconds(10),
        help: "one callback attempt's limit",
        docs: "One delivery attempt's limit; longer is a failed attempt, retried.")
    package static let callbackConcurrency = Setting<Int>.integer(
        "SIWA_CALLBACK_CONCURRENCY", flag: "callback-concurrency", .callbacks, default: 16, 1...256,
        help: "callbacks in flight at once per process",
        docs: "Callbacks in flight at once per process.")

    // MARK: Alerts
    package static let spikeInterval = Setting<Duration>.duration(
        "SIWA_SPIKE_INTERVAL", flag: "spike-interval", .alerts, default: SpikeSettings().interval, minimum: .seconds(1),
        help: "how often alerts are evaluated",
        docs: "How often alerts are evaluated (by one process at a time).")
    package static let spikeWindow = Setting<Duration>(
        "SIWA_SPIKE_WINDOW", flag: "spike-window", .alerts, default: SpikeSettings().window, shown: "`\(DurationSyntax.format(SpikeSettings().window))`",
        help: "the window whose revocations are compared with the baseline",
        docs: "The window whose revocations are compared with the baseline (at most `6h`)."
    ) { text throws(SettingValueError) in
        let window = try Setting<Duration>.duration("", flag: "", .alerts, default: .zero, minimum: .seconds(1), help: "", docs: "").parse(text)
        guard window <= .seconds(6 * 3600) else { throw SettingValueError("must be at most 6h (per-second counts are kept a day)") }
        return window
    }
    package static let spikeMinCount = Setting<Int>.integer(
        "SIWA_SPIKE_MIN_COUNT", flag: "spike-min-count", .alerts, default: SpikeSettings().minCount, 1...10_000_000,
        help: "a spike needs at least this many revocations in the window",
        docs: "A spike needs at least this many revocations in the window…")
    package static let spikeFactor = Setting<Double>(
        "SIWA_SPIKE_FACTOR", flag: "spike-factor", .alerts, default: SpikeSettings().factor, shown: "`5`",
        help: "…and at least this many times the baseline",
        docs: "…and at least this many times the baseline."
    ) { text throws(SettingValueError) in
        guard let factor = Double(text), factor.isFinite, factor > 1, factor <= 1000 else {
            throw SettingValueError("must be a number above 1 and at most 1000, e.g. 5 or 2.5 (got \"\(text)\")")
        }
        return factor
    }
    package static let spikeNewAppCount = Setting<Int>.integer(
        "SIWA_SPIKE_NEW_APP_COUNT", flag: "spike-new-app-count", .alerts, default: SpikeSettings().newAppCount, 1...10_000_000,
        help: "an app with under a day of history fires at this many in the window",
        docs: "An app with under a day of history (no baseline) fires at this many in the window.")
    package static let spikeResolveAfter = Setting<Duration>.duration(
        "SIWA_SPIKE_RESOLVE_AFTER", flag: "spike-resolve-after", .alerts, default: SpikeSettings().resolveAfter,
        help: "an alert resolves after this long back to normal",
        docs: "An alert resolves after its series has been normal this long.")
    package static let alertWebhookURLs = Setting<String?>.optionalText(
        "SIWA_ALERT_WEBHOOK_URLS", flag: "alert-webhook-urls", .alerts, shown: "none",
        help: "comma-separated http(s) URLs POSTed each alert, signed with SIWA_ALERT_SECRET",
        docs: "Comma-separated URLs POSTed each alert (JSON, signed with `SIWA_ALERT_SECRET`, Standard Webhooks).")
    package static let alertSecret = Setting<String?>.optionalText(
        "SIWA_ALERT_SECRET", flag: "alert-secret", .alerts, shown: "— (required with alert webhook URLs)",
        help: "space-separated whsec_ secrets that sign alert webhooks (never a callback secret)",
        docs: "One or more space-separated `whsec_…` secrets that sign alert webhooks; must differ from every `SIWA_CALLBACK_SECRET`.",
        secret: true)
    package static let alertSlackURL = Setting<String?>.optionalText(
        "SIWA_ALERT_SLACK_URL", flag: "alert-slack-url", .alerts, shown: "none",
        help: "a Slack-compatible incoming-webhook URL for alerts",
        docs: "A Slack-compatible incoming-webhook URL (a message in words).", secret: true)
    package static let alertQueueLag = Setting<Duration>.duration(
        "SIWA_ALERT_QUEUE_LAG", flag: "alert-queue-lag", .alerts, default: .seconds(120), minimum: .seconds(1),
        help: "queue_lag fires when the oldest ready job has waited this long",
        docs: "`queue_lag` fires when the oldest ready job has waited this long.")
    package static let alertBadSignatures = Setting<Int>.integer(
        "SIWA_ALERT_BAD_SIGNATURES", flag: "alert-bad-signatures", .alerts, default: 20, 1...10_000_000,
        help: "bad_signatures fires at this many in the spike window",
        docs: "`bad_signatures` fires at this many in the window (sampled-out ones count).")
    package static let alertDiscardedJobs = Setting<Int>.integer(
        "SIWA_ALERT_DISCARDED_JOBS", flag: "alert-discarded-jobs", .alerts, default: 1, 1...10_000_000,
        help: "jobs_discarded fires at this many discards in the spike window",
        docs: "`jobs_discarded` fires at this many discards in the window.")

    // MARK: Logging
    package static let logLevel = Setting<Logger.Level?>(
        "SIWA_LOG_LEVEL", flag: "log-level", .logging, default: nil, shown: "`info` (`serve`), `warning` (other commands)",
        help: "trace|debug|info|notice|warning|error|critical",
        docs: "`trace`, `debug`, `info`, `notice`, `warning`, `error` or `critical`; anything else stops the command (exit 78)."
    ) { text throws(SettingValueError) in
        guard let level = Logger.Level(rawValue: text.lowercased()) else {
            throw SettingValueError("must be one of \(Logger.Level.valueNames) (got \"\(text)\")")
        }
        return level
    }
    package static let logFormat = Setting<LogFormat>.choice(
        "SIWA_LOG_FORMAT", flag: "log-format", .logging, default: .text, shown: "`text`", expected: "text or json",
        help: "text|json: key=value lines (values quoted when needed) or one JSON object per line",
        docs: "`text`: `key=value` lines, a value quoted (`\"…\"`, with `\\\"`, `\\\\` and control characters escaped) when it holds a space, `=`, `\"` or a control character, so no value from a request can forge a line or a key. `json`: one JSON object per line.")

    /// Every setting, grouped, in the order `--help` and the README list them.
    package static let all: [SettingInfo] = [
        databaseURL.info, embeddedDatabase.info, dataDirectory.info, postgresBinaries.info, databasePoolSize.info, databaseTimeout.info,
        migrateOnStart.info,
        bundleIDs.info, jwksURL.info, jwksRefreshInterval.info, unknownKidCooldown.info, jwksMaximumAge.info, clockSkew.info, clientIDs.info,
        host.info, port.info, adminHost.info, adminHosts.info, adminPort.info, httpRequestTimeout.info, httpIdleTimeout.info, httpFirstRequestTimeout.info,
        tlsHandshakeTimeout.info, httpMaxConnections.info, tlsCertificateFile.info, tlsKeyFile.info, trustedProxies.info, metricsToken.info,
        commitQueueLimit.info, role.info, shutdownGrace.info,
        rejectionsPerMinute.info, otherAppTokensPerHour.info, otherAppTokenRetention.info, historyRetention.info,
        workers.info, jobLease.info, jobMaxAttempts.info, jobRetention.info, jobPollInterval.info, jobNotify.info,
        eraseOnDelete.info, sessionTTL.info,
        callbackURL.info, callbackSecret.info, callbackTimeout.info, callbackConcurrency.info,
        spikeInterval.info, spikeWindow.info, spikeMinCount.info, spikeFactor.info, spikeNewAppCount.info, spikeResolveAfter.info,
        alertWebhookURLs.info, alertSecret.info, alertSlackURL.info, alertQueueLag.info, alertBadSignatures.info, alertDiscardedJobs.info,
        logLevel.info, logFormat.info,
    ]

    /// The setting a flag (without dashes) sets.
    package static func named(flag: String) -> SettingInfo? { all.first { $0.flag == flag } }
    /// The setting read from an environment variable.
    package static func named(variable: String) -> SettingInfo? { all.first { $0.variable == variable } }
}
