import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore
import Synchronization

/// What one delivery round did.
package struct DeliveryRound: Sendable, Equatable {
    /// Deliveries claimed (0: nothing was ready).
    package var claimed = 0
    package var delivered = 0
    package var retrying = 0
    package var discarded = 0
    /// Attempts whose lease had run out meanwhile (another deliverer has them now).
    package var leaseLost = 0
    /// Attempts that could not be recorded (their lease will expire and they are sent again).
    package var notRecorded = 0
    /// Attempts cut short by graceful shutdown: not recorded, their leases released on the way out.
    package var handedBack = 0
}

/// Delivers one lane (`DeliveryLane`: callbacks to the backend's endpoint, alerts to the sinks):
/// claims a batch with a lease, sends them concurrently through the lane's sender, records each
/// attempt. It has its own doorbell and its own jobs, so a slow or dead endpoint never holds back
/// an effect. A heartbeat renews the leases of the deliveries in hand; graceful shutdown finishes
/// those, stops claiming and hands back what this deliverer still holds.
package final class Deliverer: Service, Sendable {
    /// What a deliverer reads besides its lane: the queue's lease and poll interval.
    package struct Configuration: Sendable {
        package var lease: Duration
        package var pollInterval: Duration
        /// Whether the listener wakes an idle deliverer (nil: it polls).
        package var listening: ListenState?

        package init(lease: Duration, pollInterval: Duration, listening: ListenState? = nil) {
            self.lease = lease
            self.pollInterval = pollInterval
            self.listening = listening
        }

        /// How long an idle deliverer waits before it claims again.
        var idleWait: Duration { listening?.idleWait(poll: pollInterval) ?? pollInterval }
    }

    package let lane: DeliveryLane
    /// The name its leases are held under.
    package let worker: String
    let configuration: Configuration
    let queue: JobQueue
    let doorbell: Doorbell
    let logger: Logger
    let metrics: WorkerMetrics?
    /// The deliveries in hand right now: the only leases the heartbeat renews. One given up on
    /// (its attempt could not be recorded) is no longer renewed, so the rescuer hands it on.
    private let inHand = Mutex<[Int]>([])
    /// Claims given up on shutdown (see `claimUnlessStopping`).
    private let abandonedClaims = Atomic<Int>(0)

    package init(
        lane: DeliveryLane, worker: String, configuration: Configuration, queue: JobQueue, doorbell: Doorbell = Doorbell(), logger: Logger,
        metrics: WorkerMetrics? = nil
    ) {
        self.lane = lane
        self.worker = worker
        self.configuration = configuration
        self.queue = queue
        self.doorbell = doorbell
        self.logger = logger
        self.metrics = metrics
    }

    /// Rings when jobs of this lane were enqueued.
    package func wake() { doorbell.ring() }

    package func run() async throws {
        let http = HTTPClient(
            eventLoopGroup: HTTPClient.defaultEventLoopGroup,
            configuration: .init(redirectConfiguration: .disallow, timeout: .init(connect: .init(lane.timeout), read: .init(lane.timeout))))
        var schedule = Schedule(interval: configuration.lease / 3)
        schedule.firstWait = configuration.lease / 3
        schedule.stopsOnGracefulShutdown = false  // cancelled once the deliveries in hand are finished
        let heartbeat = schedule
        await withDiscardingTaskGroup { helpers in
            helpers.addTask {
                await Scheduler.run(heartbeat, once: { try await self.heartbeatOnce() }) { _ in }
            }
            await Scheduler.run(
                Schedule(interval: configuration.pollInterval, doorbell: doorbell), once: { try await self.runOnce(http: http) },
                pace: { [configuration] in $0.claimed > 0 ? .again : .idleFor(configuration.idleWait) }
            ) { error in
                logger.warning("worker: database error; retrying", metadata: ["worker": "\(worker)", "error": "\(loggable(error))"])
            }
            helpers.cancelAll()
        }
        // Graceful shutdown stops the deliverers before the database client (service order), so
        // what is still held can be handed back. When cancelled outright, the client may be gone
        // already: leave it to the lease. Either way never wait on the database for long.
        if !Task.isCancelled {
            let (queue, worker) = (self.queue, self.worker)
            func release() async -> Int {
                (try? await withDeadline(.seconds(5)) { try await queue.release(workers: [worker]) })?[worker] ?? 0
            }
            var released = await release()
            // A claim abandoned on shutdown may commit after that: once more, a moment later
            // (otherwise its jobs wait out their lease and are rescued with an attempt spent).
            if abandonedClaims.load(ordering: .relaxed) > 0 && !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(500))
                released += await release()
            }
            if released > 0 { logger.info("released jobs on shutdown", metadata: ["worker": "\(worker)", "count": "\(released)"]) }
        }
        try? await http.shutdown()
    }

    /// Renews the leases of the deliveries in hand at `now` (nil: PostgreSQL's); returns how many.
    @discardableResult
    package func heartbeatOnce(now: Date? = nil) async throws -> Int {
        let jobs = inHand.withLock { $0 }
        guard !jobs.isEmpty else { return 0 }
        try await queue.heartbeat(worker: worker, jobs: jobs, lease: configuration.lease, now: now)
        return jobs.count
    }

    /// Claims one batch and attempts each, concurrently, each attempt recorded.
    @discardableResult
    package func runOnce(http: HTTPClient) async throws -> DeliveryRound {
        let (queue, lane, worker, lease) = (self.queue, self.lane, self.worker, configuration.lease)
        let claimed = try await claimUnlessStopping {
            try await queue.claimDeliveries(lane: lane.lane, worker: worker, limit: lane.concurrency, lease: lease)
        }
        var round = DeliveryRound(claimed: claimed.count)
        guard !claimed.isEmpty else { return round }
        inHand.withLock { $0 = claimed.map(\.id) }
        defer { inHand.withLock { $0 = [] } }
        // Graceful shutdown cancels the attempts in flight: they are handed back unrecorded instead
        // of holding SIGTERM until a slow endpoint answers or times out.
        let results = await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Attempted.self) { group in
                for delivery in claimed {
                    group.addTask { await self.deliver(delivery, http: http) }
                }
                return await group.reduce(into: [Attempted]()) { $0.append($1) }
            }
        }
        for result in results {
            switch result {
            case .delivered: round.delivered += 1
            case .retrying: round.retrying += 1
            case .discarded: round.discarded += 1
            case .leaseLost: round.leaseLost += 1
            case .notRecorded: round.notRecorded += 1
            case .handedBack: round.handedBack += 1
            }
        }
        return round
    }

    private enum Attempted: String, Sendable {
        case delivered, retrying, discarded, leaseLost = "lease_lost", notRecorded = "not_recorded", handedBack = "handed_back"
    }

    /// A claim is not waited for on shutdown: nothing is in hand yet, and one that never answers
    /// (a statement lost at a database restart, see `BoundedPostgres`) would hold SIGTERM for the
    /// whole grace period. One abandoned may still commit in the database: `run` releases twice then.
    private func claimUnlessStopping<T: Sendable>(_ claim: @escaping @Sendable () async throws -> T) async throws -> T {
        do {
            return try await cancelWhenGracefulShutdown(claim)
        } catch let error as CancellationError where Task.isShuttingDownGracefully {
            abandonedClaims.add(1, ordering: .relaxed)
            throw error
        }
    }

    /// One attempt at a delivery: sent by the lane's sender, recorded, with one log line.
    private func deliver(_ delivery: ClaimedDelivery, http: HTTPClient) async -> Attempted {
        let started = ContinuousClock.now
        let outcome = await lane.sender.send(delivery, timeout: lane.timeout, http: http)
        // Cut short by shutdown: not an attempt. The lease is released on the way out.
        if Task.isCancelled { return .handedBack }
        var delay = lane.retry.backoff.delay(attempt: delivery.attempt, unit: Double.random(in: 0..<1))
        if case .throttled(_, _, let retryAfter) = outcome { delay = max(delay, retryAfter) }
        var metadata: Logger.Metadata = ["job_id": "\(delivery.id)", "attempt": "\(delivery.attempt)", "ms": "\((ContinuousClock.now - started).milliseconds)"]
        metadata.merge(lane.sender.metadata(delivery)) { $1 }
        do {
            let state = try await queue.recordDelivery(delivery, worker: worker, outcome: outcome, maxAttempts: lane.retry.maxAttempts, delay: delay)
            let result: Attempted = switch (outcome, state) {
            case (.delivered, _): .delivered
            case (_, .discarded?): .discarded
            case (_, nil): .leaseLost
            case (_, _): .retrying
            }
            metrics?.attempt(lane: delivery.lane.rawValue, outcome: result.rawValue, took: ContinuousClock.now - started)
            switch outcome {
            case .delivered(let status):
                metadata["status"] = "\(status.map(String.init) ?? "none")"
                logger.info("\(lane.event)", metadata: metadata.merging(["outcome": "delivered"]) { $1 })
            case .failed(let status, let error), .throttled(let status, let error, _):
                metadata["status"] = "\(status.map(String.init) ?? "none")"
                metadata["error"] = "\(error)"
                metadata["outcome"] = "\(result.rawValue)"
                if state == .retryable { metadata["retry_in_ms"] = "\(delay.milliseconds)" }
                logger.warning("\(lane.event)", metadata: metadata)
            case .undeliverable(let error):
                metadata["status"] = "none"
                metadata["error"] = "\(error)"
                metadata["outcome"] = "\(result.rawValue)"
                logger.warning("\(lane.event)", metadata: metadata)
            }
            return result
        } catch {
            logger.warning(
                "could not record a delivery attempt; its lease will expire and it will be sent again",
                metadata: metadata.merging(["error": "\(loggable(error))"]) { $1 })
            return .notRecorded
        }
    }
}
