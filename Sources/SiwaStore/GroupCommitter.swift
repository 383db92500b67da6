import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import Synchronization

/// Group commit for the receiver: concurrent requests share one transaction and one WAL flush,
/// none answered before its commit. A batch is whatever queued meanwhile; at most
/// `maximumInFlight` commit at once (BENCHMARKS.md). Content the database refuses is retried row
/// by row, so it fails alone (`NotificationRefused`). Each request waits at most `timeout` (one
/// timer for all, `sweep`); past `maximumQueued` waiting, a request is refused at once
/// (`CommitQueueFull`, 503). A `Service`: commits run in its own task group.
package final class GroupCommitter: Service, Sendable {
    private struct Pending: Sendable {
        var item: NotificationStore.Incoming
        var waiter: Waiter
        var attempts = 0
    }

    private struct State {
        var queue: [Pending] = []
        var inFlight = 0
        /// Requests in arrival order, so in deadline order (one timeout; deadlines are taken just
        /// before the lock, so at most microseconds out of order). Answered ones leave from the
        /// front, after each batch and at each sweep.
        var watched: [Waiter] = []
        var sweepScheduled = false
        /// Callers of `settled`, resumed when no batch is committing and none is queued.
        var settledWaiters: [CheckedContinuation<Void, Never>] = []
        /// Callers of `wait(committing:queued:within:)`, resumed once the state reaches theirs.
        var occupancyWaiters: [(id: Int, slots: Int, queued: Int, continuation: CheckedContinuation<Bool, Never>)] = []
        var nextWaiter = 0

        /// Takes out the occupancy waiters whose state is reached.
        mutating func reached() -> [CheckedContinuation<Bool, Never>] {
            let (inFlight, queued) = (inFlight, queue.count)
            let ready = occupancyWaiters.filter { $0.slots <= inFlight && $0.queued <= queued }
            occupancyWaiters.removeAll { $0.slots <= inFlight && $0.queued <= queued }
            return ready.map(\.continuation)
        }
    }

    private let store: NotificationStore
    private let maximumBatch: Int
    private let maximumInFlight: Int
    private let maximumQueued: Int
    private let timeout: Duration
    private let logger: Logger
    private let onBatch: @Sendable (Int) -> Void
    private let state = Mutex(State())
    /// A kept connection per commit slot, free ones on top (see `KeptConnection`); none: each
    /// batch leases one.
    private let slots: Mutex<[KeptConnection]>
    /// Batches taken, for `run` to commit.
    private let batches: AsyncStream<[Pending]>
    private let batchesIn: AsyncStream<[Pending]>.Continuation

    /// `onBatch` is told each batch's size (for the `siwa_commit_batch_size` histogram).
    package init(
        store: NotificationStore, maximumBatch: Int = 512, maximumInFlight: Int = 2, maximumQueued: Int = GroupCommitter.defaultMaximumQueued,
        timeout: Duration, keepConnections: Bool = false, logger: Logger, onBatch: @escaping @Sendable (Int) -> Void = { _ in }
    ) {
        self.store = store
        self.maximumBatch = maximumBatch
        self.maximumInFlight = maximumInFlight
        self.maximumQueued = maximumQueued
        self.timeout = timeout
        self.logger = logger
        self.onBatch = onBatch
        let slotLimit = Self.slotLimit(timeout: timeout)
        self.slots = Mutex(keepConnections ? (0..<maximumInFlight).map { _ in KeptConnection(client: store.client, limit: slotLimit) } : [])
        (batches, batchesIn) = AsyncStream.makeStream()
    }

    /// Commits the batches taken, concurrently (at most `maximumInFlight`), until graceful
    /// shutdown; a batch already committing is finished.
    package func run() async throws {
        await withDiscardingTaskGroup { group in
            await withGracefulShutdownHandler {
                for await batch in batches {
                    group.addTask { await self.commit(batch) }
                }
            } onGracefulShutdown: {
                self.batchesIn.finish()
            }
        }
        for slot in slots.withLock({ $0 }) { slot.close() }
    }

    /// How long a commit slot's call may run before the slot moves on to another connection: its
    /// requests were answered 503 at `timeout` already, so waiting longer only holds the slot
    /// (the call itself goes on, and a late commit makes Apple's retry a duplicate).
    static func slotLimit(timeout: Duration) -> Duration { max(timeout * 3, .seconds(15)) }

    /// Requests waiting for a commit slot at most, by default: far above what a peak keeps queued
    /// (64 connections keep at most 64); about 3 KiB each, so ≈ 13 MiB when full (`scripts/bench
    /// overload`).
    package static let defaultMaximumQueued = 4_096

    /// Records `item`; returns once the transaction holding it has committed. Throws
    /// `DeadlineExceeded` after `timeout` without that commit, `CommitQueueFull` at once when
    /// `maximumQueued` requests already wait for a commit slot, and `CancellationError` at once
    /// when the caller is cancelled.
    package func record(_ item: NotificationStore.Incoming) async throws -> RecordOutcome {
        let waiter = Waiter(deadline: .now + timeout)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                guard waiter.wait(continuation) else { return }  // cancelled already
                enqueue(Pending(item: item, waiter: waiter))
            }
        } onCancel: {
            waiter.resume(.failure(CancellationError()))
        }
    }

    /// Requests waiting for a commit slot now.
    package var queued: Int { state.withLock { $0.queue.count } }

    /// Returns once no batch is committing and no request waits for a commit slot (at once if so
    /// now): what was taken has committed, or failed, by then.
    package func settled() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state in
                guard state.inFlight > 0 || !state.queue.isEmpty else { return true }
                state.settledWaiters.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Returns true once at least `slots` batches are committing and at least `queued` requests
    /// wait for a slot (at once if so now), false after `limit` without: for a test to know
    /// where its deliveries are instead of guessing from time.
    package func wait(committing slots: Int, queued: Int = 0, within limit: Duration) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let id = state.withLock { state -> Int? in
                if state.inFlight >= slots && state.queue.count >= queued { return nil }
                state.nextWaiter += 1
                state.occupancyWaiters.append((state.nextWaiter, slots, queued, continuation))
                return state.nextWaiter
            }
            guard let id else { return continuation.resume(returning: true) }
            after(limit) { [self] in
                let expired = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                    guard let index = state.occupancyWaiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.occupancyWaiters.remove(at: index).continuation
                }
                expired?.resume(returning: false)
            }
        }
    }

    private func enqueue(_ pending: Pending) {
        let (batch, sweep, full, reached): ([Pending]?, Bool, Bool, [CheckedContinuation<Bool, Never>]) = state.withLock { state in
            // A non-empty queue means both slots are busy: a free one takes the queue at once.
            guard state.queue.count < maximumQueued else { return (nil, false, true, []) }
            state.queue.append(pending)
            state.watched.append(pending.waiter)
            let sweep = !state.sweepScheduled
            state.sweepScheduled = true
            let batch = takeBatch(&state)
            return (batch, sweep, false, state.reached())
        }
        for waiter in reached { waiter.resume(returning: true) }
        if full {
            pending.waiter.resume(.failure(CommitQueueFull(limit: maximumQueued)))
            return
        }
        if sweep { scheduleSweep(at: pending.waiter.deadline) }
        if let batch { start(batch) }
    }

    private func scheduleSweep(at deadline: ContinuousClock.Instant) {
        after(max(.zero, deadline - .now)) { self.sweep() }
    }

    /// Fails the requests whose deadline has passed, and schedules the next sweep for the oldest
    /// request still waiting — at least `sweepInterval` later, so that while the database hangs
    /// and every request expires in turn, the sweeps stay a few per second, not one per request.
    ///
    /// A failed request still in the queue (its batch not started: both commit slots were busy
    /// all along) leaves it: it was answered 503, so Apple retries it, and keeping it would let a
    /// hang of any length pile up every delivery in memory, to be committed once the database is
    /// back. One already in a committing batch stays there (a late commit only makes the retry a
    /// duplicate).
    private func sweep() {
        let now = ContinuousClock.now
        let (expired, next): ([Waiter], ContinuousClock.Instant?) = state.withLock { state in
            var expired: [Waiter] = []
            var dropped = 0
            for waiter in state.watched {
                if waiter.isAnswered {
                    dropped += 1
                } else if waiter.deadline <= now {
                    expired.append(waiter)
                    dropped += 1
                } else {
                    break
                }
            }
            state.watched.removeFirst(dropped)
            if !expired.isEmpty { state.queue.removeAll { $0.waiter.deadline <= now || $0.waiter.isAnswered } }
            guard let first = state.watched.first else {
                state.sweepScheduled = false
                return (expired, nil)
            }
            return (expired, max(first.deadline, now + Self.sweepInterval))
        }
        for waiter in expired { waiter.resume(.failure(DeadlineExceeded(limit: timeout))) }
        if let next { scheduleSweep(at: next) }
    }

    /// How late past its deadline a request may be answered, at most.
    static let sweepInterval: Duration = .milliseconds(10)

    /// Takes the next batch if a commit slot is free.
    private func takeBatch(_ state: inout State) -> [Pending]? {
        guard !state.queue.isEmpty, state.inFlight < maximumInFlight else { return nil }
        let count = min(maximumBatch, state.queue.count)
        let batch = Array(state.queue.prefix(count))
        state.queue.removeFirst(count)
        state.inFlight += 1
        return batch
    }

    private func start(_ batch: [Pending]) {
        batchesIn.yield(batch)
    }

    private func commit(_ batch: [Pending]) async {
        onBatch(batch.count)
        // A slot is free: at most `maximumInFlight` batches commit at once. It is back before
        // `finish` starts the next batch.
        let slot = slots.withLock { $0.popLast() }
        let unresolved = await record(batch, on: slot)
        if let slot { slots.withLock { $0.append(slot) } }
        finish(unresolved: unresolved)
    }

    /// Commits `batch` on `slot` and answers its requests; returns those to try again (a copy
    /// committed concurrently elsewhere made their outcome undecidable in this snapshot).
    private func record(_ batch: [Pending], on slot: KeptConnection?) async -> [Pending] {
        var unresolved: [Pending] = []
        do {
            let outcomes = try await store.record(batch.map(\.item), kept: slot)
            for (pending, outcome) in zip(batch, outcomes) {
                if let outcome {
                    pending.waiter.resume(.success(outcome))
                } else if pending.attempts < 3 {
                    var again = pending
                    again.attempts += 1
                    unresolved.append(again)
                } else {
                    pending.waiter.resume(.failure(StoreError.conflictUnresolved(jti: pending.item.notification.jti)))
                }
            }
        } catch where !canHeal(error) {
            // Refused for what a row holds: alone, it is answered as refused (retrying fails
            // again); in a batch, each notification is recorded alone so only that row fails.
            guard batch.count > 1 else {
                batch[0].waiter.resume(.failure(NotificationRefused(cause: error)))
                return []
            }
            logger.warning("batch refused by the database; recording its notifications one by one", metadata: ["size": "\(batch.count)", "error": "\(loggable(error))"])
            for pending in batch {
                do {
                    let outcome = try await store.record(pending.item.notification, rawJWS: pending.item.rawJWS, receivedAt: pending.item.receivedAt, remoteAddress: pending.item.remoteAddress)
                    pending.waiter.resume(.success(outcome))
                } catch where !canHeal(error) {
                    pending.waiter.resume(.failure(NotificationRefused(cause: error)))
                } catch {
                    pending.waiter.resume(.failure(error))
                }
            }
        } catch {
            for pending in batch { pending.waiter.resume(.failure(error)) }
        }
        return unresolved
    }

    /// Frees the batch's commit slot and starts the next batch, if one is waiting.
    private func finish(unresolved: [Pending]) {
        let (next, settled, reached): ([Pending]?, [CheckedContinuation<Void, Never>], [CheckedContinuation<Bool, Never>]) = state.withLock { state in
            state.inFlight -= 1
            state.queue.insert(contentsOf: unresolved, at: 0)
            let answered = state.watched.prefix { $0.isAnswered }.count
            state.watched.removeFirst(answered)
            let next = takeBatch(&state)
            let reached = state.reached()
            guard state.inFlight == 0 && state.queue.isEmpty else { return (next, [], reached) }
            defer { state.settledWaiters = [] }
            return (next, state.settledWaiters, reached)
        }
        for waiter in settled { waiter.resume() }
        for waiter in reached { waiter.resume(returning: true) }
        if let next { start(next) }
    }

    /// One request's wait, answered exactly once: by its commit, its deadline or its caller's
    /// cancellation, whichever comes first (later answers are dropped). Cancellation may come
    /// before the continuation is registered.
    private final class Waiter: Sendable {
        let deadline: ContinuousClock.Instant
        private let answered = Atomic<Bool>(false)
        private let state = Mutex<(continuation: CheckedContinuation<RecordOutcome, any Error>?, result: Result<RecordOutcome, any Error>?)>((nil, nil))

        init(deadline: ContinuousClock.Instant) { self.deadline = deadline }

        var isAnswered: Bool { answered.load(ordering: .acquiring) }

        /// Registers the caller's continuation; false (and the continuation resumed) when the
        /// answer is already there.
        func wait(_ continuation: CheckedContinuation<RecordOutcome, any Error>) -> Bool {
            let ready = state.withLock { state -> Result<RecordOutcome, any Error>? in
                if state.result == nil { state.continuation = continuation }
                return state.result
            }
            guard let ready else { return true }
            continuation.resume(with: ready)
            return false
        }

        func resume(_ result: Result<RecordOutcome, any Error>) {
            let continuation = state.withLock { state -> CheckedContinuation<RecordOutcome, any Error>? in
                guard state.result == nil else { return nil }
                state.result = result
                answered.store(true, ordering: .releasing)
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume(with: result)
        }
    }
}

/// A verified notification PostgreSQL refused to store for what it holds (e.g. a value too large to
/// index): storing it again would fail again, so it is answered as refused, not "retry later".
package struct NotificationRefused: Error, CustomStringConvertible {
    package let cause: any Error
    package var sqlState: String? { SiwaStore.sqlState(cause) }
    package var description: String { "the database refused the notification: \(loggable(cause))" }
}

/// `GroupCommitter.record` refused a request because `limit` requests already wait for a commit
/// slot: the database is slower than the arrivals. Nothing was written; the sender should retry.
package struct CommitQueueFull: Error, CustomStringConvertible {
    package let limit: Int
    package var description: String { "\(limit) notifications already wait for a commit slot" }
}
