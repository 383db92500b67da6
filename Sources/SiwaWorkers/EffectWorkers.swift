import Foundation
import Logging
import ServiceLifecycle
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// The worker side of a process: every background loop that turns recorded notifications into
/// effects and deliveries, each its own `Service` with a `runOnce`, each built with what it reads
/// from one configuration. The composition root runs `services`; `run()` runs them all (tests, tools).
///
/// The loops: `workers` effect workers (`EffectWorker`), a `Deliverer` per delivery lane
/// configured (`deliveryLanes`), the `QueueMaintainer` (lease rescue, job retention), the
/// `StatsFolder`, the `HistoryPruner` and, unless polling only, the `JobsListener`.
package final class EffectWorkers: Service, Sendable {
    /// The worker side's settings; `init` hands each loop its part.
    package struct Configuration: Sendable {
        package var workers = 4
        /// Jobs one claim takes at most: a backlog drains in batches this size (BENCHMARKS.md);
        /// a steady flow's batches are smaller.
        package var batchSize = 400
        package var lease: Duration = EffectStore.defaultLease
        package var pollInterval: Duration = .milliseconds(100)
        package var maxAttempts = 25
        package var backoff = RetryBackoff()
        package var eraseOnDelete = true
        package var retention: Duration = .seconds(7 * 86_400)
        package var history = HistoryPruner.Configuration()
        /// LISTEN for `siwa_jobs` (off: poll only, e.g. behind a transaction-mode pooler).
        package var listen = true
        package var maintenanceInterval: Duration = .seconds(5)
        /// Where to POST callbacks after effects (nil: no callbacks).
        package var callbacks: Callbacks?
        /// Where alert messages go (lane `alerts`; empty: the log only).
        package var alertSinks = AlertSinks()
        /// Revoking kept tokens at Apple (lane `apple_revocations`; nil: no Apple credentials).
        package var appleRevocations: AppleRevocations?
        /// Apple's own `account-delete`/`consent-revoked` queue the user's kept tokens for
        /// revocation too; off, they are deleted (Apple has ended them).
        package var revokeOnAppleEvents = false
        /// Validate kept tokens daily (`AppleTokenValidator`; nil: off). Needs `appleRevocations`.
        package var appleValidation: AppleTokenValidator.Configuration?

        package init() {}

        package var retry: RetryPolicy { RetryPolicy(maxAttempts: maxAttempts, backoff: backoff) }

        /// The delivery lanes this process runs, each with its sender (`apple` calls Apple and
        /// `tokens` keeps its tokens).
        package func deliveryLanes(apple: AppleGateway?, tokens: AppleTokenStore, logger: Logger) -> [DeliveryLane] {
            var lanes: [DeliveryLane] = (callbacks.map { [.callbacks($0, retry: retry)] } ?? []) + (alertSinks.isEmpty ? [] : [.alerts(alertSinks, retry: retry)])
            if let appleRevocations, let apple {
                lanes.append(.appleRevocations(appleRevocations, gateway: apple, retry: retry))
                if appleValidation != nil {
                    lanes.append(.appleValidations(appleRevocations, store: tokens, gateway: apple, retry: retry, logger: logger))
                }
            }
            return lanes
        }

        /// The gateway of this process's calls to Apple, recording through `calls`.
        func appleGateway(calls: AppleTokenStore) -> AppleGateway? {
            appleRevocations.map { AppleGateway(client: $0.client, recorder: calls, pacer: $0.pacer) }
        }
    }

    package let configuration: Configuration
    /// This process's effect workers are `<identity>/<n>`, its deliverers `<identity>/<lane>`.
    package let identity: String
    let logger: Logger
    package let effects: [EffectWorker]
    package let deliverers: [Deliverer]
    package let maintainer: QueueMaintainer
    package let statsFolder: StatsFolder
    package let historyPruner: HistoryPruner
    package let listener: JobsListener?
    /// Kept tokens' daily validation, when configured.
    package let validator: AppleTokenValidator?
    private let effectDoorbell: Doorbell

    package init(
        configuration: Configuration, store: EffectStore, logger: Logger, identity: String = EffectWorkers.defaultIdentity(), metrics: WorkerMetrics? = nil
    ) {
        self.configuration = configuration
        self.identity = identity
        self.logger = logger
        let doorbells = Dictionary(uniqueKeysWithValues: Lane.all.map { ($0, Doorbell()) })
        let queue = JobQueue(client: store.client, logger: logger)
        effectDoorbell = doorbells[.effects]!
        let appleTokens = AppleTokenStore(client: store.client, logger: logger)
        let apple = configuration.appleGateway(calls: appleTokens)
        let lanes = configuration.deliveryLanes(apple: apple, tokens: appleTokens, logger: logger)
        deliverers = lanes.map { lane in
            Deliverer(
                lane: lane, worker: "\(identity)/\(lane.lane)",
                configuration: Deliverer.Configuration(lease: configuration.lease, pollInterval: configuration.pollInterval), queue: queue,
                doorbell: doorbells[lane.lane]!, logger: logger, metrics: metrics)
        }
        let callbacks = lanes.contains { $0.lane == .callbacks }
        let effect = EffectWorker.Configuration(
            batchSize: configuration.batchSize, lease: configuration.lease, pollInterval: configuration.pollInterval, retry: configuration.retry,
            eraseOnDelete: configuration.eraseOnDelete, callbacks: callbacks,
            appleTokens: configuration.appleRevocations != nil && configuration.revokeOnAppleEvents ? .revoke : .forget)
        let crew = EffectCrew(batchSize: configuration.batchSize)
        effects = (0..<configuration.workers).map { [effectDoorbell] index in
            EffectWorker(
                name: "\(identity)/\(index)", configuration: effect, store: store, doorbell: effectDoorbell,
                callbackDoorbell: callbacks ? doorbells[.callbacks] : nil, logger: logger, metrics: metrics, crew: crew)
        }
        maintainer = QueueMaintainer(
            configuration: .init(maxAttempts: configuration.maxAttempts, retention: configuration.retention, interval: configuration.maintenanceInterval),
            queue: queue, doorbells: Array(doorbells.values), logger: logger)
        let history = HistoryStore(client: store.client, logger: logger)
        statsFolder = StatsFolder(history: history, interval: configuration.maintenanceInterval, logger: logger)
        var pruning = configuration.history
        pruning.retryAfter = configuration.maintenanceInterval
        historyPruner = HistoryPruner(
            configuration: pruning, notifications: NotificationStore(client: store.client, logger: logger),
            rejections: RejectionStore(client: store.client, logger: logger), history: history, logger: logger)
        listener = !configuration.listen ? nil : JobsListener(client: store.client, doorbells: doorbells, logger: logger)
        if let validation = configuration.appleValidation, apple != nil {
            validator = AppleTokenValidator(configuration: validation, store: appleTokens, queue: queue, logger: logger)
        } else {
            validator = nil
        }
    }

    package static func defaultIdentity() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UUID().uuidString.prefix(6))"
    }

    package func workerName(_ index: Int) -> String { "\(identity)/\(index)" }

    /// The deliverer of `lane`, when this process delivers it.
    package func deliverer(_ lane: Lane) -> Deliverer? { deliverers.first { $0.lane.lane == lane } }

    /// Every loop, each a service of its own.
    package var services: [any Service] {
        let optional: [(any Service)?] = [listener, validator]
        let always: [any Service] = [maintainer, statsFolder, historyPruner]
        return effects.map { $0 as any Service } + deliverers.map { $0 as any Service } + optional.compactMap { $0 } + always
    }

    /// Runs every loop until graceful shutdown (each stops as its own service would).
    package func run() async throws {
        logger.info(
            "effect workers starting",
            metadata: [
                "workers": "\(configuration.workers)", "identity": "\(identity)",
                "callbacks": "\(configuration.callbacks.map { URLRedaction.redacted($0.url) } ?? "off")",
            ])
        await withDiscardingTaskGroup { group in
            for service in services {
                group.addTask { try? await service.run() }
            }
        }
        logger.info("effect workers stopped", metadata: ["identity": "\(identity)"])
    }

    /// Effect jobs were enqueued by this process (its receiver): wakes an idle worker without
    /// waiting for the NOTIFY to come back from PostgreSQL.
    package func wake() { effectDoorbell.ring() }
}
