import Foundation
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import Prometheus
import ServiceLifecycle
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaHTTP
import SiwaStore
import SiwaWorkers
import Synchronization
import UnixSignals
import HummingbirdCore
import HummingbirdTLS
import NIOSSL

/// The composition root of a serving process: every component built once, in dependency order,
/// and one Hummingbird application whose service group runs them — the receiver (role all or
/// receiver) and the effect workers (role all or worker). Tests build it too.
package struct SiwaApplication: Sendable {
    package let store: NotificationStore
    package let rejectionStore: RejectionStore
    package let keys: AppleKeyCache
    package let rejections: RejectionRecorder
    package let committer: GroupCommitter
    package let registry: PrometheusCollectorRegistry
    let metrics: ReceiverMetrics
    let notifications: NotificationsController?
    let health: HealthController
    let adminHosts: [String]
    package let workers: EffectWorkers?
    package let alerts: AlertMonitor?
    package let endpointChecker: EndpointChecker?
    package let effects: EffectStore
    package let tokens: TokenStore
    let backend: BackendController?
    let history: HistoryController?
    let alertsAPI: AlertsController?
    let suppressionsAPI: SuppressionsController?
    let transfersAPI: TransfersController?
    let databaseTimeout: Duration
    let metricsToken: String?
    let listeners: ListenerConnections

    package init(
        config: Configuration, client: PostgresClient, logger: Logger, keyFetcher: any KeySetFetcher = DefaultKeySetFetcher(),
        clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        let registry = PrometheusCollectorRegistry()
        let metrics = ReceiverMetrics(registry: registry, audiences: config.apple.bundleIDs)
        let keepConnections = config.database.poolSize >= KeptConnection.minimumPool
        let store = NotificationStore(client: client, keepConnections: keepConnections, logger: logger)
        let rejectionStore = RejectionStore(client: client, logger: logger)
        let keys = AppleKeyCache(
            configuration: config.apple.keys, fetcher: keyFetcher, persistence: store, logger: logger, onRefresh: { metrics.count(keyRefresh: $0) })
        self.metrics = metrics
        let rejections = RejectionRecorder(
            store: rejectionStore, limitPerMinute: config.rejections.perMinute, tokensPerAudiencePerHour: config.rejections.otherAppTokensPerHour, metrics: metrics,
            logger: logger)
        let committer = GroupCommitter(
            store: store, maximumQueued: config.http.commitQueueLimit, timeout: config.database.timeout, keepConnections: keepConnections, logger: logger
        ) {
            metrics.batchSize.record(Double($0))
        }
        self.committer = committer
        self.notifications = !config.receives ? nil : NotificationsController(
            verifier: NotificationVerifier(audiences: Set(config.apple.bundleIDs), clockSkew: config.apple.clockSkew), keys: keys,
            committer: committer,
            rejections: rejections, metrics: metrics, trustedProxies: config.http.trustedProxies, logger: logger)
        let endpointChecks = EndpointCheckStore(client: client, logger: logger)
        self.health = HealthController(
            store: store, keys: config.receives ? keys : nil, databaseTimeout: config.database.timeout, endpoint: (config.alerts.endpoint, endpointChecks),
            queue: JobQueue(client: client, logger: logger), suppressionTargets: config.workers.lanes.mail?.targets ?? [], clock: clock)
        self.adminHosts = config.http.adminHosts
        let effects = EffectStore(client: client, logger: logger)
        self.effects = effects
        self.tokens = TokenStore(client: client, logger: logger)
        self.backend = !config.receives ? nil : BackendController(
            accounts: AccountStore(
                client: client, logger: logger,
                suppressions: SuppressionOptions(targets: config.workers.lanes.mail?.targets ?? [])), keys: keys,
            settings: .init(
                bundleIDs: Set(config.apple.bundleIDs), clientIDs: config.apple.clientIDs, sessionTTL: config.sessionTTL, clockSkew: config.apple.clockSkew,
                databaseTimeout: config.database.timeout),
            appleSignIn: config.appleCredentials.map {
                // The workers' pacing too: a 429 pauses every call this process makes to Apple.
                let gateway = AppleGateway(
                    client: $0.client(), recorder: AppleTokenStore(client: client, logger: logger), pacer: config.workers.lanes.apple?.pacer ?? ApplePacer())
                return AppleSignIn(gateway: gateway, cipher: $0.tokenCipher)
            }, clock: clock)
        self.history = !config.receives ? nil : HistoryController(
            history: HistoryStore(client: client, logger: logger), rejections: rejectionStore, callbackURL: config.workers.lanes.callbacks?.url)
        self.alertsAPI = !config.receives ? nil : AlertsController(alerts: AlertStore(client: client, logger: logger))
        self.suppressionsAPI = !config.receives ? nil : SuppressionsController(store: SuppressionStore(client: client, logger: logger), apps: config.apple.bundleIDs)
        self.transfersAPI = !config.receives ? nil : TransfersController(transfers: TransferStore(client: client, logger: logger), clock: clock)
        self.databaseTimeout = config.database.timeout
        self.metricsToken = config.http.metricsToken
        self.listeners = ListenerConnections(maximum: config.http.limits.maximumConnections)
        let workers = !config.works ? nil : EffectWorkers(
            configuration: config.workers, store: effects, logger: logger, metrics: WorkerMetrics(registry: registry))
        self.workers = workers
        if let workers { store.jobsNotifier.addLocalWaker { workers.wake() } }
        self.alerts = workers.map {
            AlertMonitor(
                configuration: config.alerts, store: AlertStore(client: client, logger: logger), logger: logger, identity: $0.identity,
                metrics: AlertMetrics(registry: registry))
        }
        // The endpoint check (SIWA_PUBLIC_URL), in a process with workers, as the evaluator.
        self.endpointChecker = config.alerts.endpoint.url == nil ? nil : workers.map {
            EndpointChecker(
                settings: config.alerts.endpoint, store: endpointChecks, leases: LeaseStore(client: client, logger: logger), logger: logger, identity: $0.identity,
                metrics: EndpointMetrics(registry: registry))
        }
        self.store = store
        self.rejectionStore = rejectionStore
        self.keys = keys
        self.rejections = rejections
        self.registry = registry
    }

    /// Connections open on `listener` now.
    package func openConnections(on listener: Listener) -> Int { listeners[listener].current }

    /// Returns once the count of connections open on `listener` meets `condition` (tests: a
    /// connection is counted on its event loop, some time after the client's `connect` returned).
    package func waitForConnections(on listener: Listener, until condition: @escaping @Sendable (Int) -> Bool) async {
        await listeners[listener].wait(until: condition)
    }

    /// The public listener's routes: what Apple and load balancers call, nothing else.
    package func publicRouter() -> Router<SiwaRequestContext> {
        let router = Router(context: SiwaRequestContext.self)
        notifications?.register(on: router)
        health.register(on: router, for: .publicListener)
        MethodNotAllowed.register(on: router)
        return router
    }

    /// The admin listener's routes: the API, the dashboard, its contract and the metrics (and
    /// health, for probes on the private side). `methodNotAllowed`: answer 405 for the other
    /// methods of each path (off only to list the routes themselves).
    package func adminRouter(methodNotAllowed: Bool = true) -> Router<SiwaRequestContext> {
        let router = Router(context: SiwaRequestContext.self)
        router.add(middleware: AdminHostGuard(names: adminHosts))
        health.register(on: router, for: .admin)
        if let backend {
            let v1 = router.group("v1")
                .add(middleware: APIErrorMiddleware())
                .add(middleware: RejectNULMiddleware())
                .add(middleware: BearerAuthMiddleware(tokens: tokens, databaseTimeout: databaseTimeout))
            backend.register(on: v1)
            history?.register(on: v1)
            alertsAPI?.register(on: v1)
            suppressionsAPI?.register(on: v1)
            transfersAPI?.register(on: v1)
            WebController().register(on: router)
        }
        OpenAPIController().register(on: router)
        let (keys, metrics, listeners) = (self.keys, self.metrics, self.listeners)
        MetricsController(registry: registry, token: metricsToken) {
            metrics.keySetAge.set(keys.fetchedAt.map { Date().timeIntervalSince($0).rounded() } ?? -1)
            for listener in Listener.allCases { metrics.set(openConnections: listeners[listener].current, listener: listener) }
        }.register(on: router)
        if methodNotAllowed { MethodNotAllowed.register(on: router) }
        return router
    }

    /// The two listeners' HTTP servers: HTTP/1.1 (HTTPS on the public one with SIWA_TLS_*), each
    /// behind the connection guard (`ConnectionLimits`) with a count of its own.
    package func httpServers(config: Configuration) throws -> (public: HTTPServerBuilder, admin: HTTPServerBuilder) {
        let tls = try config.http.tlsConfiguration()
        let (limits, metrics, listeners) = (config.http.limits, self.metrics, self.listeners)
        func server(_ listener: Listener, tls: TLSConfiguration?) -> HTTPServerBuilder {
            HTTPServerBuilder { responder in
                let http = HTTP1Channel(
                    responder: responder, configuration: .init(additionalChannelHandlers: GuardedChildChannel<HTTP1Channel>.additionalHandlers()))
                let onCut: @Sendable (ConnectionCut) -> Void = { metrics.count(cut: $0, listener: listener) }
                guard let tls else {
                    return GuardedChildChannel(http, limits: limits, tls: false, connections: listeners[listener], onCut: onCut)
                }
                return GuardedChildChannel(try TLSChannel(http, tlsConfiguration: tls), limits: limits, tls: true, connections: listeners[listener], onCut: onCut)
            }
        }
        return (server(.public, tls: tls), server(.admin, tls: nil))
    }

    /// The services of a serving process, in start order (stopped in reverse): the public
    /// application — whose service group also runs the PostgreSQL client, the key-set refresher,
    /// the rejection writer, the jobs notifier, the group committer, each worker loop, the alert
    /// evaluator and the endpoint check — then the admin one.
    /// Before the public server binds: migrations (or the check that none is pending); the key set
    /// load (which the listeners do not wait for), the workers, the evaluator and the admin server
    /// start after them.
    package func services(
        config: Configuration, client: PostgresClient, logger: Logger, servers: (public: HTTPServerBuilder, admin: HTTPServerBuilder)? = nil,
        onPublicRunning: @escaping @Sendable (any Channel) async -> Void = { _ in },
        onAdminRunning: @escaping @Sendable (any Channel) async -> Void = { _ in }
    ) throws -> [any Service] {
        let servers = try servers ?? httpServers(config: config)
        let migrated = StartGate()
        var loops: [any Service] = workers?.services ?? []
        if let alerts { loops.append(alerts) }
        if let endpointChecker { loops.append(endpointChecker) }
        var publicApp = Application(
            router: publicRouter(),
            server: servers.public,
            configuration: .init(address: .hostname(config.http.host, port: config.http.port), serverName: nil),
            services: [client] + (config.receives ? [rejections, store.jobsNotifier, committer] : [])
                + (config.receives ? [keys] + loops : loops).map { GatedService(gate: migrated, service: $0) },
            onServerRunning: onPublicRunning,
            logger: logger)
        publicApp.beforeServerStarts {
            let migrator = Migrator(client: client, logger: logger)
            if config.database.migrateOnStart {
                try await migrator.migrate()
            } else {
                try await migrator.checkUpToDate()
            }
            if let problem = try? await ConnectedRole.read(client, logger: logger).superuserProblem {
                logger.warning("\(problem)")
            }
            try await Self.checkTokenKeys(config.appleCredentials?.tokenCipher, client: client, logger: logger)
            migrated.open()
        }
        var adminApp = Application(
            router: adminRouter(),
            server: servers.admin,
            configuration: .init(address: .hostname(config.http.adminHost, port: config.http.adminPort), serverName: nil),
            onServerRunning: onAdminRunning,
            logger: logger)
        adminApp.beforeServerStarts { await migrated.wait() }
        return [
            ListenerService(app: publicApp, address: "\(config.http.host):\(config.http.port)", host: Settings.host.info, port: Settings.port.info),
            ListenerService(app: adminApp, address: "\(config.http.adminHost):\(config.http.adminPort)", host: Settings.adminHost.info, port: Settings.adminPort.info),
        ]
    }
}

extension SiwaApplication {
    /// Every kept token and pending revocation must be under a key of the keyring: one that is not
    /// could never be revoked, so start-up stops naming the setting (a wrong or dropped key).
    static func checkTokenKeys(_ cipher: AppleTokenCipher?, client: PostgresClient, logger: Logger) async throws {
        let byKey = try await AppleTokenStore(client: client, logger: logger).ciphertextsByKey()
        let unknown = byKey.filter { !(cipher?.keyIDs.contains($0.key) ?? false) }
        guard !unknown.isEmpty else { return }
        let count = unknown.values.reduce(0, +)
        let keys = unknown.keys.sorted().joined(separator: ", ")
        guard cipher != nil else {
            logger.warning(
                "\(count) kept Apple token(s) but no Apple credentials: they cannot be revoked until SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID, SIWA_APPLE_PRIVATE_KEY_FILE and SIWA_APPLE_TOKEN_KEYS are set",
                metadata: ["keys": "\(keys)"])
            return
        }
        throw ConfigurationError(
            variable: Settings.appleTokenKeys.info.name,
            message: "holds no key \(keys), under which \(count) kept Apple token(s) are encrypted: add that key back (after the new one), run `siwa-events apple reencrypt`, then drop it")
    }
}

/// A listener's application, whose failure to bind names the address and the setting to change
/// (instead of NIO's `bind(descriptor:ptr:bytes:): Address already in use`).
struct ListenerService<App: Service>: Service {
    let app: App
    let address: String
    let host: SettingInfo
    let port: SettingInfo

    func run() async throws {
        do {
            try await app.run()
        } catch let error as IOError where "\(error)".hasPrefix("bind") {
            let message: String =
                switch error.errnoCode {
                case EADDRINUSE: "\(address) is already in use: stop what listens there, or choose another port with \(port.name)"
                case EACCES: "\(address) needs privileges this process lacks: choose a port of 1024 or more with \(port.name)"
                case EADDRNOTAVAIL: "\(address) is not an address of this machine: set \(host.name) to one of its addresses (or 0.0.0.0)"
                default: "cannot listen on \(address) (\(error)): check \(host.name) and \(port.name)"
                }
            throw ConfigurationError(variable: port.variable, message: message)
        }
    }
}

/// The two HTTP listeners of a serving process.
package enum Listener: String, Sendable, CaseIterable {
    /// `POST /apple/notifications` and `/health/*` (SIWA_HOST, SIWA_PORT).
    case `public`
    /// `/v1`, the dashboard, `/openapi.yaml`, `/metrics` (SIWA_ADMIN_HOST, SIWA_ADMIN_PORT).
    case admin
}

/// Each listener's open connections.
struct ListenerConnections: Sendable {
    let registries: [Listener: ConnectionRegistry]
    init(maximum: Int) { registries = Dictionary(uniqueKeysWithValues: Listener.allCases.map { ($0, ConnectionRegistry(maximum: maximum)) }) }
    subscript(listener: Listener) -> ConnectionRegistry { registries[listener]! }
}

/// `siwa-events serve`: the receiver on the configured database, until SIGTERM/SIGINT.
package enum Server {
    package static func serve(_ config: Configuration, logger: Logger) async throws {
        _ = try config.http.tlsConfiguration()  // a bad certificate stops start-up before the database opens
        if let url = config.database.url, let warning = DatabaseURL.transportWarning(url) { logger.warning("\(warning)") }
        guard try await Database.waitUntilReachable(config.database, logger: logger) else { return }  // stopped while waiting
        let database = try await Database.open(config.database, logger: logger, serving: true, creating: true)
        let receiver = SiwaApplication(config: config, client: database.client, logger: logger)
        let services = try receiver.services(
            config: config, client: database.client, logger: logger,
            onPublicRunning: { channel in
                logger.notice(
                    "siwa-events listening",
                    metadata: [
                        "address": "\(channel.localAddress?.ipAddress ?? config.http.host):\(channel.localAddress?.port ?? config.http.port)", "database": "\(database.description)",
                        "bundle_ids": "\(config.apple.bundleIDs.joined(separator: ","))", "tls": "\(config.http.tlsCertificateFile == nil ? "off (behind a TLS proxy)" : "on")", "jwks_url": "\(URLRedaction.redacted(config.apple.keys.sourceURL))",
                    ])
            },
            onAdminRunning: { channel in
                logger.notice(
                    "admin listener (API, dashboard, metrics)",
                    metadata: ["address": "\(channel.localAddress?.ipAddress ?? config.http.adminHost):\(channel.localAddress?.port ?? config.http.adminPort)"])
                logger.notice("optional parts", metadata: config.optionalParts)
            })
        // SIGTERM/SIGINT: Hummingbird stops accepting and finishes in-flight requests, the workers
        // abandon their batch (it commits or rolls back whole) and hand back the deliveries they
        // hold; after SIWA_SHUTDOWN_GRACE whatever is still running is cancelled.
        let watch = ShutdownWatch()
        var group = ServiceGroupConfiguration(services: [watch] + services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        group.maximumGracefulShutdownDuration = config.shutdownGrace
        group.maximumCancellationDuration = .seconds(5)
        do {
            try await ServiceGroup(configuration: group).run()
        } catch {
            await database.close()
            throw error
        }
        await database.close()
        logger.notice("siwa-events stopped")
        if watch.cutShort {
            logger.error("shutdown took longer than SIWA_SHUTDOWN_GRACE; what was still running was cancelled", metadata: ["grace": "\(DurationSyntax.format(config.shutdownGrace))"])
            throw ShutdownCutShort(grace: config.shutdownGrace)
        }
    }
}

/// The first service of the group, so the last told to stop: cancelled instead means graceful
/// shutdown ran out of time (`SIWA_SHUTDOWN_GRACE`) and the group cancelled what was still running.
final class ShutdownWatch: Service, Sendable {
    private let cancelled = Atomic<Bool>(false)

    var cutShort: Bool { cancelled.load(ordering: .relaxed) }

    func run() async throws {
        do {
            try await gracefulShutdown()
        } catch is CancellationError {
            cancelled.store(true, ordering: .relaxed)
        }
    }
}

/// `serve` stopped, but not gracefully: the process exits 1.
package struct ShutdownCutShort: Error, CustomStringConvertible {
    package let grace: Duration
    package var description: String { "shutdown took longer than SIWA_SHUTDOWN_GRACE (\(DurationSyntax.format(grace))); what was still running was cancelled" }
}
