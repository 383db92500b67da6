import Foundation
import Logging
import ServiceLifecycle
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// The worker side of a process: every background loop that turns recorded notifications into
/// effects and deliveries, each its own `Service` with a `runOnce`, built from its own part of the
/// configuration and listed once (`services`). The composition root runs `services`; `run()` runs
/// them all (tests, tools).
///
/// The loops: `effects.workers` effect workers (`EffectWorker`), a `Deliverer` per delivery lane
/// whose destination is set (`deliveryLanes`), the `QueueMaintainer` (lease rescue, job
/// retention), the `StatsFolder`, the `HistoryPruner`, unless polling only the `JobsListener`,
/// and with Apple credentials and validation on, the `AppleTokenValidator`.
package final class EffectWorkers: Service, Sendable {
    /// Each loop's part: `init` hands each loop its own.
    package struct Configuration: Sendable {
        /// Every lane: lease, polling, attempts, backoff, NOTIFY.
        package var queue = QueuePolicy()
        /// The effect workers.
        package var effects = EffectSettings()
        /// The deliverers' destinations.
        package var lanes = DeliveryDestinations()
        /// The maintainer and the stats folder.
        package var upkeep = QueueUpkeep()
        /// The history pruner.
        package var history = HistoryPruner.Configuration()
        /// The daily validation of kept tokens (`AppleTokenValidator`; nil: off). Needs `lanes.apple`.
        package var appleValidation: AppleTokenValidator.Configuration?

        package init() {}

        /// The delivery lanes this process runs, each with its sender (`apple` calls Apple and
        /// `tokens` keeps its tokens).
        package func deliveryLanes(apple: AppleGateway?, tokens: AppleTokenStore, logger: Logger) -> [DeliveryLane] {
            let retry = queue.retry
            var deliveries: [DeliveryLane] = (lanes.callbacks.map { [.callbacks($0, retry: retry)] } ?? [])
                + (lanes.alertSinks.isEmpty ? [] : [.alerts(lanes.alertSinks, retry: retry)])
            if let revocations = lanes.apple, let apple {
                deliveries.append(.appleRevocations(revocations, gateway: apple, retry: retry))
                if appleValidation != nil {
                    deliveries.append(.appleValidations(revocations, store: tokens, gateway: apple, retry: retry, logger: logger))
                }
            }
            if let mail = lanes.mail {
                deliveries += mail.providers.map { .suppressions($0, of: mail, retry: retry) }
            }
            return deliveries
        }

        /// The gateway of this process's calls to Apple, recording through `calls`.
        func appleGateway(calls: AppleTokenStore) -> AppleGateway? {
            lanes.apple.map { AppleGateway(client: $0.client, recorder: calls, pacer: $0.pacer) }
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
        let listening = configuration.queue.listen ? ListenState() : nil
        effectDoorbell = doorbells[.effects]!
        let appleTokens = AppleTokenStore(client: store.client, logger: logger)
        let apple = configuration.appleGateway(calls: appleTokens)
        let lanes = configuration.deliveryLanes(apple: apple, tokens: appleTokens, logger: logger)
        deliverers = lanes.map { lane in
            Deliverer(
                lane: lane, worker: "\(identity)/\(lane.lane)",
                configuration: Deliverer.Configuration(lease: configuration.queue.lease, pollInterval: configuration.queue.pollInterval, listening: listening), queue: queue,
                doorbell: doorbells[lane.lane]!, logger: logger, metrics: metrics)
        }
        let callbacks = lanes.contains { $0.lane == .callbacks }
        let (policy, settings, upkeep) = (configuration.queue, configuration.effects, configuration.upkeep)
        let effect = EffectWorker.Configuration(
            batchSize: settings.batchSize, lease: policy.lease, pollInterval: policy.pollInterval, listening: listening, retry: policy.retry,
            eraseOnDelete: settings.eraseOnDelete, callbacks: callbacks,
            appleTokens: configuration.lanes.apple != nil && settings.revokeOnAppleEvents ? .revoke : .forget,
            suppressions: SuppressionOptions(
                policy: .init(onConsentRevoked: settings.suppressOnConsentRevoked), targets: configuration.lanes.mail?.targets ?? []))
        let crew = EffectCrew(batchSize: settings.batchSize)
        effects = (0..<settings.workers).map { [effectDoorbell] index in
            EffectWorker(
                name: "\(identity)/\(index)", configuration: effect, store: store, doorbell: effectDoorbell,
                callbackDoorbell: callbacks ? doorbells[.callbacks] : nil, logger: logger, metrics: metrics, crew: crew)
        }
        maintainer = QueueMaintainer(
            configuration: .init(maxAttempts: policy.maxAttempts, retention: upkeep.retention, interval: upkeep.interval),
            queue: queue, doorbells: Array(doorbells.values), logger: logger)
        let history = HistoryStore(client: store.client, logger: logger)
        let activity = listening.map { _ in Doorbell() }
        statsFolder = StatsFolder(history: history, interval: upkeep.foldInterval, activity: activity, logger: logger)
        var pruning = configuration.history
        pruning.retryAfter = upkeep.interval
        historyPruner = HistoryPruner(
            configuration: pruning, notifications: NotificationStore(client: store.client, logger: logger),
            rejections: RejectionStore(client: store.client, logger: logger), history: history, logger: logger)
        let running = [Lane.effects] + deliverers.map(\.lane.lane)
        listener = listening.map {
            JobsListener(
                queue: queue, doorbells: doorbells.filter { running.contains($0.key) }, activity: activity.map { [$0] } ?? [], state: $0,
                checkInterval: policy.checkInterval, logger: logger)
        }
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

    /// Every loop, each a service of its own: the one list `serve`, tests and tools run.
    package var services: [any Service] {
        let loops: [[(any Service)?]] = [effects, deliverers, [listener, validator, maintainer, statsFolder, historyPruner]]
        return loops.joined().compactMap { $0 }
    }

    /// Runs every loop until graceful shutdown (each stops as its own service would).
    package func run() async throws {
        logger.info(
            "effect workers starting",
            metadata: [
                "workers": "\(configuration.effects.workers)", "identity": "\(identity)",
                "callbacks": "\(configuration.lanes.callbacks.map { URLRedaction.redacted($0.url) } ?? "off")",
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
