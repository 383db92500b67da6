import Foundation
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import Prometheus
import ServiceLifecycle
import SiwaDomain
import SiwaHTTP
import SiwaKeys
import SiwaStore
import SiwaWorkers
import UnixSignals
import HummingbirdCore
import HummingbirdTLS
import NIOSSL

/// The composition root of a serving process: every component built once, in dependency order,
/// and one Hummingbird application whose service group runs them — the receiver (role all or
/// receiver) and the effect workers (role all or worker). Tests build it too.
package struct Receiver: Sendable {
    package let store: NotificationStore
    package let rejectionStore: RejectionStore
    package let keys: AppleKeyCache
    package let rejections: RejectionRecorder
    package let committer: GroupCommitter
    package let registry: PrometheusCollectorRegistry
    let metrics: ReceiverMetrics
    let notifications: NotificationsController?
    let health: HealthController
    package let workers: EffectWorkers?
    package let alerts: AlertMonitor?
    package let effects: EffectStore
    package let tokens: TokenStore
    let backend: BackendController?
    let history: HistoryController?
    let alertsAPI: AlertsController?
    let databaseTimeout: Duration
    let metricsToken: String?

    package init(
        config: Configuration, client: PostgresClient, logger: Logger, keyFetcher: any KeySetFetcher = DefaultKeySetFetcher(),
        clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        let registry = PrometheusCollectorRegistry()
        let metrics = ReceiverMetrics(registry: registry, audiences: config.bundleIDs)
        let store = NotificationStore(client: client, logger: logger)
        let rejectionStore = RejectionStore(client: client, logger: logger)
        let keys = AppleKeyCache(
            configuration: .init(sourceURL: config.jwksURL, refreshInterval: config.jwksRefreshInterval, unknownKidCooldown: config.unknownKidCooldown),
            fetcher: keyFetcher, persistence: store, logger: logger, onRefresh: { metrics.count(keyRefresh: $0) })
        self.metrics = metrics
        let rejections = RejectionRecorder(store: rejectionStore, limitPerMinute: config.rejectionsPerMinute, metrics: metrics, logger: logger)
        let committer = GroupCommitter(store: store, maximumQueued: config.commitQueueLimit, timeout: config.databaseTimeout, logger: logger) {
            metrics.batchSize.record(Double($0))
        }
        self.committer = committer
        self.notifications = !config.receives ? nil : NotificationsController(
            verifier: NotificationVerifier(audiences: Set(config.bundleIDs), clockSkew: config.clockSkew), keys: keys,
            committer: committer,
            rejections: rejections, metrics: metrics, trustedProxies: config.trustedProxies, logger: logger)
        self.health = HealthController(store: store, keys: config.receives ? keys : nil, databaseTimeout: config.databaseTimeout)
        let effects = EffectStore(client: client, logger: logger)
        self.effects = effects
        self.tokens = TokenStore(client: client, logger: logger)
        self.backend = !config.receives ? nil : BackendController(
            accounts: AccountStore(client: client, logger: logger), keys: keys,
            settings: .init(
                bundleIDs: Set(config.bundleIDs), clientIDs: config.clientIDs, sessionTTL: config.sessionTTL, clockSkew: config.clockSkew,
                databaseTimeout: config.databaseTimeout), clock: clock)
        self.history = !config.receives ? nil : HistoryController(
            history: HistoryStore(client: client, logger: logger), rejections: rejectionStore)
        self.alertsAPI = !config.receives ? nil : AlertsController(alerts: AlertStore(client: client, logger: logger))
        self.databaseTimeout = config.databaseTimeout
        self.metricsToken = config.metricsToken
        let workers = !config.works ? nil : EffectWorkers(
            configuration: config.workerConfiguration, store: effects, logger: logger, metrics: WorkerMetrics(registry: registry))
        self.workers = workers
        if let workers { store.jobsNotifier.addLocalWaker { workers.wake() } }
        self.alerts = workers.map {
            AlertMonitor(
                configuration: config.alertConfiguration, store: AlertStore(client: client, logger: logger), logger: logger, identity: $0.identity,
                metrics: AlertMetrics(registry: registry))
        }
        self.store = store
        self.rejectionStore = rejectionStore
        self.keys = keys
        self.rejections = rejections
        self.registry = registry
    }

    /// Every route of the receiving process.
    package func router() -> Router<SiwaRequestContext> {
        let router = Router(context: SiwaRequestContext.self)
        notifications?.register(on: router)
        health.register(on: router)
        if let backend {
            let v1 = router.group("v1")
                .add(middleware: APIErrorMiddleware())
                .add(middleware: RejectNULMiddleware())
                .add(middleware: BearerAuthMiddleware(tokens: tokens, databaseTimeout: databaseTimeout))
            backend.register(on: v1)
            history?.register(on: v1)
            alertsAPI?.register(on: v1)
        }
        if backend != nil { WebController().register(on: router) }
        router.get("/openapi.yaml") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/yaml; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: OpenAPIDocument.bytes)))
        }
        let registry = self.registry
        let metricsToken = self.metricsToken
        let (keys, metrics) = (self.keys, self.metrics)
        router.get("/metrics") { request, _ in
            if let metricsToken {
                let given = request.headers[.authorization].map { Array($0.utf8) } ?? []
                guard constantTimeEqual(given, Array("Bearer \(metricsToken)".utf8)) else {
                    throw APIError(.unauthorized, code: "unauthorized", message: "/metrics needs Authorization: Bearer <SIWA_METRICS_TOKEN>")
                }
            }
            metrics.keySetAge.set(keys.fetchedAt.map { Date().timeIntervalSince($0).rounded() } ?? -1)
            var buffer: [UInt8] = []
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
        return router
    }

    /// The HTTP application; its service group also runs the PostgreSQL client, the key cache's
    /// refresh loop, the rejection writer, the workers and the alert evaluator. Before the server
    /// binds: migrations (or the check that none is pending) — the workers and the evaluator start
    /// after them — and the key set load.
    package func application(
        config: Configuration, client: PostgresClient, logger: Logger, server: HTTPServerBuilder = .http1(),
        onServerRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
    ) -> some ApplicationProtocol {
        let migrated = StartGate()
        var app = Application(
            router: router(),
            server: server,
            configuration: .init(address: .hostname(config.host, port: config.port), serverName: nil),
            services: [client] + (config.receives ? [keys, rejections] : [])
                + ([workers, alerts] as [(any Service)?]).compactMap { $0.map { GatedService(gate: migrated, service: $0) } },
            onServerRunning: onServerRunning,
            logger: logger)
        let keys = self.keys
        app.beforeServerStarts {
            let migrator = Migrator(client: client, logger: logger)
            if config.migrateOnStart {
                try await migrator.migrate()
            } else {
                try await migrator.checkUpToDate()
            }
            migrated.open()
            if config.receives { await keys.load() }
        }
        return app
    }
}

/// `siwa-events serve`: the receiver on the configured database, until SIGTERM/SIGINT.
package enum Server {
    package static func serve(_ config: Configuration, logger: Logger) async throws {
        let server = try config.httpServer()
        let database = try await Database.open(config, logger: logger, serving: true)
        let receiver = Receiver(config: config, client: database.client, logger: logger)
        let app = receiver.application(config: config, client: database.client, logger: logger, server: server) { channel in
            logger.notice(
                "siwa-events listening",
                metadata: [
                    "address": "\(channel.localAddress?.ipAddress ?? config.host):\(channel.localAddress?.port ?? config.port)", "database": "\(database.description)",
                    "bundle_ids": "\(config.bundleIDs.joined(separator: ","))", "tls": "\(config.tlsCertificateFile == nil ? "off (behind a TLS proxy)" : "on")", "jwks_url": "\(config.jwksURL.absoluteString)",
                ])
        }
        // SIGTERM/SIGINT: Hummingbird stops accepting and finishes in-flight requests, the workers
        // abandon their batch (it commits or rolls back whole) and hand back the deliveries they
        // hold; after SIWA_SHUTDOWN_GRACE whatever is still running is cancelled.
        var group = ServiceGroupConfiguration(services: [app], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        group.maximumGracefulShutdownDuration = config.shutdownGrace
        group.maximumCancellationDuration = .seconds(5)
        do {
            try await ServiceGroup(configuration: group).run()
        } catch {
            await database.close()
            throw error
        }
        await database.close()
    }
}

extension Configuration {
    package var workerConfiguration: EffectWorkers.Configuration {
        var workers = EffectWorkers.Configuration()
        workers.workers = self.workers
        workers.lease = jobLease
        workers.maxAttempts = jobMaxAttempts
        workers.retention = jobRetention
        workers.pollInterval = jobPollInterval
        workers.listen = jobNotify
        workers.eraseOnDelete = eraseOnDelete
        workers.historyRetention = historyRetention
        workers.alertSinks = alertSinks
        if let callbackURL, let callbackSigner {
            var callbacks = EffectWorkers.Callbacks(url: callbackURL, signer: callbackSigner)
            callbacks.timeout = callbackTimeout
            callbacks.concurrency = callbackConcurrency
            workers.callbacks = callbacks
        }
        return workers
    }
}

extension Configuration {
    package var alertSinks: AlertSinks {
        AlertSinks(webhooks: alertWebhooks, slack: alertSlackURL, signer: alertSigner)
    }

    package var alertConfiguration: AlertMonitor.Configuration {
        var alerts = AlertMonitor.Configuration()
        alerts.spike = spike
        alerts.queueLag = alertQueueLag
        alerts.badSignatures = alertBadSignatures
        alerts.discardedJobs = alertDiscardedJobs
        alerts.sinks = alertSinks
        return alerts
    }
}

/// Compares without an early exit, so the time taken says nothing about where they differ.
func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    var difference: UInt8 = 0
    for index in a.indices { difference |= a[index] ^ b[index] }
    return difference == 0
}

extension Configuration {
    /// Plain HTTP/1.1, or HTTPS (TLS 1.2+) with SIWA_TLS_CERT_FILE / SIWA_TLS_KEY_FILE.
    package func httpServer() throws -> HTTPServerBuilder {
        guard let tlsCertificateFile, let tlsKeyFile else { return .http1() }
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(tlsCertificateFile)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_CERT_FILE", message: "\(tlsCertificateFile) is not a PEM certificate chain (\(error))")
        }
        guard !chain.isEmpty else { throw ConfigurationError(variable: "SIWA_TLS_CERT_FILE", message: "\(tlsCertificateFile) holds no certificate") }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: tlsKeyFile, format: .pem)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_KEY_FILE", message: "\(tlsKeyFile) is not a PEM private key (\(error))")
        }
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        do {
            return try .tls(.http1(), tlsConfiguration: tls)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_KEY_FILE", message: "the key does not fit the certificate or TLS cannot start (\(error))")
        }
    }
}
