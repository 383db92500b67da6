import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// The worker side of a process: every background loop that turns recorded notifications into
/// effects and deliveries, each its own `Service` with a `runOnce`, built once from one
/// configuration. The composition root runs `services`; `run()` runs them all (tests, tools).
///
/// The loops: `workers` effect workers (`EffectWorker`), a `Deliverer` per delivery lane
/// configured (callbacks, alerts), the `QueueMaintainer` (lease rescue, job retention), the
/// `StatsFolder`, the `HistoryPruner` and, unless polling only, the `JobsListener`.
package final class EffectWorkers: Service, Sendable {
    package struct Configuration: Sendable {
        package var workers = 4
        package var batchSize = 200
        package var lease: Duration = EffectStore.defaultLease
        package var pollInterval: Duration = .milliseconds(100)
        package var maxAttempts = 25
        package var backoff = RetryBackoff()
        package var eraseOnDelete = true
        package var retention: Duration = .seconds(7 * 86_400)
        /// Notifications (and rejections) older than this are pruned in the background.
        package var historyRetention: Duration = .seconds(400 * 86_400)
        /// Whole tokens kept for another app's bundle ID are deleted after this.
        package var otherAppTokenRetention: Duration = .seconds(7 * 86_400)
        /// LISTEN for `siwa_jobs` (off: poll only, e.g. behind a transaction-mode pooler).
        package var listen = true
        package var maintenanceInterval: Duration = .seconds(5)
        /// Where to POST callbacks after effects (nil: no callbacks).
        package var callbacks: Callbacks?
        /// Where alert messages go (lane `alerts`; empty: the log only).
        package var alertSinks = AlertSinks()

        package init() {}
    }

    /// The backend's callback endpoint (`SIWA_CALLBACK_URL`, `SIWA_CALLBACK_SECRET`).
    package struct Callbacks: Sendable {
        package var url: URL
        package var signer: WebhookSigner
        /// One attempt's limit, connection included; longer counts as a failed attempt.
        package var timeout: Duration = .seconds(10)
        /// Callbacks in flight at once (one claimed batch).
        package var concurrency = 16

        package init(url: URL, signer: WebhookSigner) {
            self.url = url
            self.signer = signer
        }
    }

    package let configuration: Configuration
    /// This process's effect workers are `<identity>/<n>`, its deliverers `<identity>/<lane>`.
    package let identity: String
    let logger: Logger
    package let effects: [EffectWorker]
    package let callbacks: Deliverer?
    package let alerts: Deliverer?
    package let maintainer: QueueMaintainer
    package let statsFolder: StatsFolder
    package let historyPruner: HistoryPruner
    package let listener: JobsListener?
    private let effectDoorbell: Doorbell

    package init(
        configuration: Configuration, store: EffectStore, logger: Logger, identity: String = EffectWorkers.defaultIdentity(), metrics: WorkerMetrics? = nil
    ) {
        self.configuration = configuration
        self.identity = identity
        self.logger = logger
        let effectDoorbell = Doorbell()
        self.effectDoorbell = effectDoorbell
        let callbackDoorbell = Doorbell()
        let alertDoorbell = Doorbell()
        let deliveries = CallbackStore(client: store.client, logger: logger)
        callbacks = configuration.callbacks.map {
            Deliverer(
                target: .callbacks($0), worker: "\(identity)/callbacks", configuration: configuration, store: store, deliveries: deliveries,
                doorbell: callbackDoorbell, logger: logger, metrics: metrics)
        }
        alerts = configuration.alertSinks.isEmpty ? nil : Deliverer(
            target: .alerts(configuration.alertSinks), worker: "\(identity)/alerts", configuration: configuration, store: store,
            deliveries: deliveries, doorbell: alertDoorbell, logger: logger, metrics: metrics)
        effects = (0..<configuration.workers).map { index in
            EffectWorker(
                name: "\(identity)/\(index)", configuration: configuration, store: store, doorbell: effectDoorbell,
                callbackDoorbell: configuration.callbacks == nil ? nil : callbackDoorbell, logger: logger, metrics: metrics)
        }
        maintainer = QueueMaintainer(configuration: configuration, store: store, doorbell: effectDoorbell, logger: logger)
        let history = HistoryStore(client: store.client, logger: logger)
        statsFolder = StatsFolder(history: history, interval: configuration.maintenanceInterval, logger: logger)
        historyPruner = HistoryPruner(configuration: configuration, history: history, logger: logger)
        listener = !configuration.listen ? nil : JobsListener(
            client: store.client, effects: effectDoorbell, callbacks: callbackDoorbell, alerts: alertDoorbell, logger: logger)
    }

    package static func defaultIdentity() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UUID().uuidString.prefix(6))"
    }

    package func workerName(_ index: Int) -> String { "\(identity)/\(index)" }

    package var callbackWorkerName: String { "\(identity)/callbacks" }

    package var alertWorkerName: String { "\(identity)/alerts" }

    /// Every loop, each a service of its own.
    package var services: [any Service] {
        let optional: [(any Service)?] = [callbacks, alerts, listener]
        let always: [any Service] = [maintainer, statsFolder, historyPruner]
        return effects.map { $0 as any Service } + optional.compactMap { $0 } + always
    }

    /// Runs every loop until graceful shutdown (each stops as its own service would).
    package func run() async throws {
        logger.info(
            "effect workers starting",
            metadata: ["workers": "\(configuration.workers)", "identity": "\(identity)", "callbacks": "\(configuration.callbacks.map { URLRedaction.redacted($0.url) } ?? "off")"])
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
