import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore
import Synchronization

/// The worker loops that turn recorded notifications into effects on accounts and sessions.
///
/// Each loop claims a batch of ready jobs (one per user at most), applies their effects and
/// completes them — claim included, one transaction (`EffectStore.runBatch`) — and claims again;
/// when nothing is ready it sleeps until a `siwa_jobs` NOTIFY or the poll interval. A loop that
/// dies mid-batch leaves nothing behind: the transaction rolls back. Beside the loops: a listener
/// for that NOTIFY, a heartbeat renewing the leases of deliveries in hand, and maintenance (rescue
/// of deliveries whose deliverer died, pruning of finished jobs). Graceful shutdown: stop
/// claiming, abandon a batch still running (it commits or rolls back whole), release deliveries
/// still held.
///
/// With a callback endpoint configured, one more loop delivers callbacks (lane `callbacks`, see
/// `CallbackStore`): claimed in batches, sent concurrently, each attempt recorded. It has its own
/// doorbell and its own jobs, so a slow or dead endpoint never holds back an effect.
package final class EffectWorkers: Service, Sendable {
    package struct Configuration: Sendable {
        package var workers = 4
        package var batchSize = 200
        package var lease: Duration = EffectStore.defaultStall
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
    let store: EffectStore
    let logger: Logger
    let callbackStore: CallbackStore
    let doorbell = Doorbell()
    let callbackDoorbell = Doorbell()
    let alertDoorbell = Doorbell()
    /// The deliveries each deliverer is working on right now: the only leases the heartbeat
    /// renews. One a deliverer gave up on (its database connection failed and the attempt could
    /// not be recorded) is no longer renewed, so its lease runs out and the rescuer hands it on —
    /// instead of staying `running` forever.
    private let inHand = Mutex<[String: [Int]]>([:])
    /// Delivery claims given up on shutdown (see `claimUnlessStopping`).
    private let abandonedClaims = Atomic<Int>(0)
    /// This process's workers are `<identity>/<n>`, its callback deliverer `<identity>/callbacks`.
    package let identity: String
    let metrics: WorkerMetrics?

    package init(
        configuration: Configuration, store: EffectStore, logger: Logger, identity: String = EffectWorkers.defaultIdentity(), metrics: WorkerMetrics? = nil
    ) {
        self.metrics = metrics
        self.configuration = configuration
        self.store = store
        self.callbackStore = CallbackStore(client: store.client, logger: logger)
        self.logger = logger
        self.identity = identity
    }

    package static func defaultIdentity() -> String {
        "\(ProcessInfo.processInfo.hostName):\(ProcessInfo.processInfo.processIdentifier):\(UUID().uuidString.prefix(6))"
    }

    package func workerName(_ index: Int) -> String { "\(identity)/\(index)" }

    package var callbackWorkerName: String { "\(identity)/callbacks" }

    package var alertWorkerName: String { "\(identity)/alerts" }

    /// Every name this process holds leased jobs under (heartbeats, release on shutdown): the
    /// deliverers. Effect jobs have no lease: a batch holds them only inside its transaction.
    private var holderNames: [String] {
        (configuration.callbacks == nil ? [] : [callbackWorkerName]) + (configuration.alertSinks.isEmpty ? [] : [alertWorkerName])
    }

    package func run() async throws {
        logger.info(
            "effect workers starting",
            metadata: ["workers": "\(configuration.workers)", "identity": "\(identity)", "callbacks": "\(configuration.callbacks?.url.absoluteString ?? "off")"])
        func client(timeout: Duration) -> HTTPClient {
            HTTPClient(
                eventLoopGroup: HTTPClient.defaultEventLoopGroup,
                configuration: .init(redirectConfiguration: .disallow, timeout: .init(connect: .init(timeout), read: .init(timeout))))
        }
        let http = configuration.callbacks.map { client(timeout: $0.timeout) }
        let alertHTTP = configuration.alertSinks.isEmpty ? nil : client(timeout: configuration.alertSinks.timeout)
        await withDiscardingTaskGroup { helpers in
            helpers.addTask { await self.heartbeats() }
            helpers.addTask { await self.maintenance() }
            if configuration.listen {
                helpers.addTask { await self.listen() }
            }
            // The loops end on graceful shutdown (an effect batch abandoned, deliveries in hand
            // finished); then the helpers go.
            await withGracefulShutdownHandler {
                await withDiscardingTaskGroup { loops in
                    for index in 0..<configuration.workers {
                        let worker = self.workerName(index)
                        loops.addTask { await self.poll(worker, doorbell: self.doorbell) { try await self.runOnce(worker: worker) } }
                    }
                    if let http {
                        loops.addTask {
                            await self.poll(self.callbackWorkerName, doorbell: self.callbackDoorbell) { try await self.runCallbacksOnce(http: http) }
                        }
                    }
                    if let alertHTTP {
                        loops.addTask {
                            await self.poll(self.alertWorkerName, doorbell: self.alertDoorbell) { try await self.runAlertDeliveriesOnce(http: alertHTTP) }
                        }
                    }
                }
            } onGracefulShutdown: {
                self.doorbell.close()
                self.callbackDoorbell.close()
                self.alertDoorbell.close()
            }
            helpers.cancelAll()
        }
        // Graceful shutdown stops the workers before the database client (service order), so
        // what is still held can be handed back. When cancelled outright, the client may be gone
        // already: leave it to the lease. Either way never wait on the database for long.
        if !Task.isCancelled && !holderNames.isEmpty {
            let (store, holders) = (self.store, holderNames)
            func release() async -> [String: Int] {
                (try? await withDeadline(.seconds(5)) { try await store.release(workers: holders) }) ?? [:]
            }
            var released = await release()
            // A claim abandoned on shutdown may commit after that: once more, a moment later
            // (otherwise its jobs wait out their lease and are rescued with an attempt spent).
            if abandonedClaims.load(ordering: .relaxed) > 0 && !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(500))
                released.merge(await release(), uniquingKeysWith: +)
            }
            for (worker, count) in released.sorted(by: { $0.key < $1.key }) {
                logger.info("released jobs on shutdown", metadata: ["worker": "\(worker)", "count": "\(count)"])
            }
        }
        try? await http?.shutdown()
        try? await alertHTTP?.shutdown()
        logger.info("effect workers stopped", metadata: ["identity": "\(identity)"])
    }

    private var stopping: Bool { Task.isCancelled || Task.isShuttingDownGracefully }

    /// Runs `once` until shutdown: again at once after a batch, after a ring of `doorbell` or the
    /// poll interval when nothing was ready, a second after a database error.
    private func poll(_ worker: String, doorbell: Doorbell, _ once: () async throws -> Int) async {
        while !stopping {
            do {
                if try await once() == 0 { await doorbell.wait(timeout: configuration.pollInterval) }
            } catch {
                if stopping { break }  // a claim given up on shutdown
                logger.warning("worker: database error; retrying", metadata: ["worker": "\(worker)", "error": "\(loggable(error))"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// Claims one batch and applies it, in one transaction (`EffectStore.runBatch`). Returns how
    /// many jobs it claimed (0: nothing ready).
    ///
    /// On graceful shutdown a batch still running is abandoned, not waited for: its transaction
    /// either commits whole or rolls back whole (the jobs then wait for the next claim, no attempt
    /// spent) — and one that never answers (a statement lost at a database restart, see
    /// `BoundedPostgres`) held SIGTERM for the whole grace period.
    @discardableResult
    package func runOnce(worker: String) async throws -> Int {
        let started = ContinuousClock.now
        let round: EffectStore.Round
        do {
            round = try await cancelWhenGracefulShutdown {
                try await self.store.runBatch(
                    worker: worker, limit: self.configuration.batchSize, eraseOnDelete: self.configuration.eraseOnDelete,
                    callbacks: self.configuration.callbacks != nil, stall: self.configuration.lease)
            }
        } catch let failed as EffectStore.BatchFailed {
            // One bad job must not hold back its batch: its jobs one by one.
            logger.warning(
                "batch failed; applying its jobs one by one",
                metadata: ["worker": "\(worker)", "size": "\(failed.jobs.count)", "error": "\(loggable(failed.underlying))"])
            for job in failed.jobs where !stopping {
                // Not recorded (the connection or the server failed): the rest would fail alike.
                guard await runOne(job, worker: worker) else { break }
            }
            return failed.jobs.count
        }
        guard !round.claimed.isEmpty else { return 0 }
        if configuration.callbacks != nil && !round.applied.isEmpty { callbackDoorbell.ring() }
        let elapsed = ContinuousClock.now - started
        for effect in round.applied { logApplied(effect, worker: worker, batch: round.claimed.count, elapsed: elapsed) }
        return round.claimed.count
    }

    /// One job of a failed batch, on its own: applied, or its failed attempt recorded. False when
    /// neither could be done (the job is left ready for the next claim).
    private func runOne(_ job: ClaimedJob, worker: String) async -> Bool {
        let started = ContinuousClock.now
        let (store, configuration) = (self.store, self.configuration)
        do {
            let outcome = try await cancelWhenGracefulShutdown {
                try await store.runOne(
                    job, worker: worker, eraseOnDelete: configuration.eraseOnDelete, callbacks: configuration.callbacks != nil,
                    maxAttempts: configuration.maxAttempts, stall: configuration.lease
                ) { attempt in configuration.backoff.delay(attempt: attempt, unit: Double.random(in: 0..<1)) }
            }
            let elapsed = ContinuousClock.now - started
            switch outcome {
            case .applied(let effect):
                if configuration.callbacks != nil { callbackDoorbell.ring() }
                logApplied(effect, worker: worker, batch: 1, elapsed: elapsed)
            case .failed(let error, let discarded):
                let result = discarded ? "discarded" : "retrying"
                metrics?.attempt(lane: "effects", outcome: result, took: elapsed)
                logger.warning(
                    "job",
                    metadata: ["outcome": "\(result)", "job_id": "\(job.id)", "jti": "\(job.jti)", "attempt": "\(job.attempt)", "error": "\(error)", "worker": "\(worker)"])
            case .gone:
                logger.debug("job taken by another worker meanwhile", metadata: ["job_id": "\(job.id)", "worker": "\(worker)"])
            }
            return true
        } catch {
            if stopping { return false }
            logger.warning(
                "job",
                metadata: [
                    "outcome": "not_recorded", "job_id": "\(job.id)", "jti": "\(job.jti)", "attempt": "\(job.attempt)", "worker": "\(worker)",
                    "error": "\(loggable(error))", "next": "rolled back; ready for the next claim",
                ])
            return false
        }
    }

    /// The one log line (and metrics) of an applied effect.
    private func logApplied(_ effect: AppliedEffect, worker: String, batch: Int, elapsed: Duration) {
        metrics?.attempt(lane: "effects", outcome: "applied", took: elapsed)
        metrics?.effect(type: effect.type, effect: effect.effect)
        logger.info(
            "job",
            metadata: [
                "outcome": "applied", "job_id": "\(effect.jobID)", "jti": "\(effect.jti)", "aud": "\(effect.aud)", "type": "\(effect.type)",
                "effect": "\(effect.effect)", "revoked_sessions": "\(effect.revokedSessions)", "worker": "\(worker)",
                "batch": "\(batch)", "batch_ms": "\(Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000 + Double(elapsed.components.seconds) * 1000)",
            ])
    }

    /// A delivery claim is not waited for on shutdown: nothing is in hand yet, and one that never
    /// answers (a statement lost at a database restart, see `BoundedPostgres`) held SIGTERM for
    /// the whole grace period. One abandoned may still commit in the database: `run` releases
    /// twice then.
    private func claimUnlessStopping<T: Sendable>(_ claim: @escaping @Sendable () async throws -> T) async throws -> T {
        do {
            return try await cancelWhenGracefulShutdown(claim)
        } catch let error as CancellationError where Task.isShuttingDownGracefully {
            abandonedClaims.add(1, ordering: .relaxed)
            throw error
        }
    }

    /// Runs `work` with `jobs` registered as in hand for `worker`: the heartbeat renews their
    /// leases until it returns, and no longer.
    private func holding(_ jobs: [Int], as worker: String, _ work: () async -> Void) async {
        inHand.withLock { $0[worker] = jobs }
        defer { _ = inHand.withLock { $0.removeValue(forKey: worker) } }
        await work()
    }

    // MARK: Callbacks

    /// Claims one batch of callbacks and attempts each, concurrently. Returns how many it claimed
    /// (0 also when no callback endpoint is configured).
    @discardableResult
    package func runCallbacksOnce(http: HTTPClient) async throws -> Int {
        guard let callbacks = configuration.callbacks else { return 0 }
        return try await deliverBatch(lane: .callbacks, worker: callbackWorkerName, limit: callbacks.concurrency) { callback in
            await self.deliver(callback, worker: self.callbackWorkerName, maxAttempts: self.configuration.maxAttempts) { callback in
                await self.send(callback, to: callbacks.url, signer: callbacks.signer, timeout: callbacks.timeout, http: http)
            }
        }
    }

    // MARK: Alert sinks

    /// Claims one batch of alert messages (lane `alerts`) and sends each to its sink. A message
    /// whose sink is no longer configured is discarded with that reason.
    @discardableResult
    package func runAlertDeliveriesOnce(http: HTTPClient) async throws -> Int {
        let sinks = configuration.alertSinks
        let worker = alertWorkerName
        return try await deliverBatch(lane: .alerts, worker: worker, limit: 16) { message in
            guard let (url, signed) = sinks.resolve(message.target ?? "") else {
                let error = "sink \(message.target ?? "?") is no longer configured (SIWA_ALERT_WEBHOOK_URLS or SIWA_ALERT_SLACK_URL changed)"
                await self.deliver(message, worker: worker, maxAttempts: 1) { _ in .failed(status: nil, error: error) }
                return
            }
            await self.deliver(message, worker: worker, maxAttempts: self.configuration.maxAttempts) { message in
                await self.send(message, to: url, signer: signed ? sinks.signer : nil, timeout: sinks.timeout, http: http)
            }
        }
    }

    /// Claims up to `limit` deliveries of `lane` and runs `attempt` on each, concurrently, with
    /// their leases renewed meanwhile. Returns how many it claimed.
    private func deliverBatch(
        lane: DeliveryLane, worker: String, limit: Int, _ attempt: @escaping @Sendable (ClaimedCallback) async -> Void
    ) async throws -> Int {
        let claimed = try await claimUnlessStopping {
            try await self.callbackStore.claim(lane: lane, worker: worker, limit: limit, lease: self.configuration.lease)
        }
        guard !claimed.isEmpty else { return 0 }
        await holding(claimed.map(\.id), as: worker) {
            await withDiscardingTaskGroup { group in
                for delivery in claimed {
                    group.addTask { await attempt(delivery) }
                }
            }
        }
        return claimed.count
    }

    /// One attempt at a delivery (callback or alert message), recorded, with one log line.
    private func deliver(
        _ callback: ClaimedCallback, worker: String, maxAttempts: Int, _ attempt: (ClaimedCallback) async -> DeliveryOutcome
    ) async {
        let started = ContinuousClock.now
        let outcome = await attempt(callback)
        let delay = configuration.backoff.delay(attempt: callback.attempt, unit: Double.random(in: 0..<1))
        let event = callback.lane == .callbacks ? "callback" : "alert delivery"
        var metadata: Logger.Metadata = [
            "job_id": "\(callback.id)", "webhook_id": "\(callback.webhookID)", "attempt": "\(callback.attempt)",
            "ms": "\((ContinuousClock.now - started).milliseconds)",
        ]
        if callback.lane == .callbacks { metadata["jti"] = "\(callback.jti)" } else { metadata["sink"] = "\(callback.target ?? "")" }
        do {
            let state = try await callbackStore.record(callback, worker: worker, outcome: outcome, maxAttempts: maxAttempts, delay: delay)
            let result = switch (outcome, state) {
            case (.delivered, _): "delivered"
            case (.failed, "discarded"): "discarded"
            case (.failed, nil): "lease_lost"
            case (.failed, _): "retrying"
            }
            metrics?.attempt(lane: callback.lane.rawValue, outcome: result, took: ContinuousClock.now - started)
            switch (outcome, state) {
            case (.delivered(let status), _):
                metadata["status"] = "\(status)"
                logger.info("\(event)", metadata: metadata.merging(["outcome": "delivered"]) { $1 })
            case (.failed(let status, let error), let state):
                metadata["status"] = "\(status.map(String.init) ?? "none")"
                metadata["error"] = "\(error)"
                metadata["outcome"] = "\(result)"
                if state == "retryable" { metadata["retry_in_ms"] = "\(delay.milliseconds)" }
                logger.warning("\(event)", metadata: metadata)
            }
        } catch {
            logger.warning(
                "could not record a delivery attempt; its lease will expire and it will be sent again",
                metadata: metadata.merging(["error": "\(loggable(error))"]) { $1 })
        }
    }

    /// One POST, signed when a signer is given. Any 2xx is delivered; redirects are not followed
    /// (a moved endpoint is a configuration error the operator should see).
    private func send(_ callback: ClaimedCallback, to url: URL, signer: WebhookSigner?, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        let body = Array(callback.body.utf8)
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "user-agent", value: "siwa-events")
        let timestamp = Int64(Date().timeIntervalSince1970)
        for header in signer?.headers(id: callback.webhookID, timestamp: timestamp, body: body) ?? [] {
            request.headers.add(name: header.name, value: header.value)
        }
        request.body = .bytes(body)
        do {
            let response = try await http.execute(request, timeout: .init(timeout))
            // Read (and bound) the answer so the connection can be reused; its content is not kept.
            _ = try? await response.body.collect(upTo: 64 * 1024)
            let status = Int(response.status.code)
            return (200..<300).contains(status) ? .delivered(status: status) : .failed(status: status, error: "HTTP \(status)")
        } catch {
            return .failed(status: nil, error: "\(error)")
        }
    }

    private func heartbeats() async {
        let every = configuration.lease / 3
        while !stopping {
            try? await Task.sleep(for: every)
            for (worker, jobs) in inHand.withLock({ $0 }) {
                try? await store.heartbeat(worker: worker, jobs: jobs, lease: configuration.lease)
            }
        }
    }

    private func maintenance() async {
        var lastPrune = ContinuousClock.now - .seconds(3600)
        while !stopping {
            do {
                let rescued = try await store.rescueExpiredLeases(maxAttempts: configuration.maxAttempts)
                if rescued > 0 {
                    logger.warning("rescued jobs whose worker stopped renewing its lease", metadata: ["count": "\(rescued)"])
                    doorbell.ring()
                }
                // Stats counts: fold what the ingest triggers appended (bounded per round).
                let history = HistoryStore(client: store.client, logger: logger)
                for _ in 0..<10 {
                    if try await history.foldCounts() < HistoryStore.foldLimit || stopping { break }
                }
                if ContinuousClock.now - lastPrune > .seconds(60) {
                    lastPrune = ContinuousClock.now
                    let pruned = try await store.prune(retention: configuration.retention)
                    if pruned > 0 { logger.info("pruned finished jobs", metadata: ["count": "\(pruned)"]) }
                    // History past SIWA_HISTORY_RETENTION, a thousand rows at a time, at most 50,000 a minute.
                    var removed = 0
                    for _ in 0..<50 {
                        let batch = try await history.prune(retention: configuration.historyRetention)
                        removed += batch
                        if batch < 1000 || stopping { break }
                    }
                    if removed > 0 { logger.info("pruned notifications past their retention", metadata: ["count": "\(removed)"]) }
                    let cleared = try await history.deleteKeptTokens(olderThan: configuration.otherAppTokenRetention)
                    if cleared > 0 { logger.info("deleted tokens kept for other apps past their retention", metadata: ["count": "\(cleared)"]) }
                }
            } catch {
                if stopping { break }  // a statement abandoned on shutdown
                logger.warning("queue maintenance failed; will retry", metadata: ["error": "\(loggable(error))"])
            }
            try? await Task.sleep(for: configuration.maintenanceInterval)
        }
    }

    /// Effect jobs were enqueued by this process (its receiver): wakes an idle worker without
    /// waiting for the NOTIFY to come back from PostgreSQL.
    package func wake() { doorbell.ring() }

    /// LISTEN siwa_jobs on one pooled connection; rings the doorbell on each NOTIFY. Reconnects
    /// after errors (database restart); workers poll meanwhile.
    private func listen() async {
        while !stopping {
            do {
                // LISTEN holds a pooled connection. It gives it back every 10 s and takes one again:
                // after a database outage postgres-nio's pool opens a single connection for the
                // requests queued meanwhile and serves the others only as connections come back;
                // if LISTEN held that one for good, every other query waited forever (seen: a
                // worker-restart test run with only the LISTEN connection open after the restart).
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await self.store.client.bounded.withConnection { connection in
                            try await connection.listen(on: "siwa_jobs") { notifications in
                                // Catch up on anything enqueued before LISTEN took effect.
                                self.doorbell.ring()
                                self.callbackDoorbell.ring()
                                self.alertDoorbell.ring()
                                for try await notification in notifications {
                                    if notification.payload == "callbacks" {
                                        self.callbackDoorbell.ring()
                                    } else if notification.payload == "alerts" {
                                        self.alertDoorbell.ring()
                                    } else {
                                        self.doorbell.ring()
                                    }
                                }
                            }
                        }
                    }
                    group.addTask { try await Task.sleep(for: .seconds(10)) }
                    try await group.next()
                    group.cancelAll()
                }
            } catch {
                if stopping { return }
                logger.debug("LISTEN siwa_jobs interrupted; reconnecting", metadata: ["error": "\(loggable(error))"])
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }
}
