import Logging
import NIOCore
import PostgresNIO
import SiwaRuntime
import Synchronization

/// A pool connection kept while calls keep coming (a commit slot's batches, the jobs notifier's
/// NOTIFYs), given back after `linger` without one. postgres-nio arms an idle timer (a task group,
/// a `Task.sleep`, a dispatch timer) each time a connection goes back to the pool, so leasing per
/// batch paid that per batch (BENCHMARKS.md). At rest nothing is kept: right
/// after an outage the one connection back is free for the readiness ping. Calls are bounded as
/// `BoundedPostgres`'s: answered within `limit`, at once when the caller is cancelled; a call past
/// its limit keeps the connection it is stuck on, and the next call leases another.
package final class KeptConnection: Sendable {
    package static let defaultLinger: Duration = .milliseconds(250)
    /// The smallest pool that lends connections to be kept (the commit slots and the notifier keep
    /// three at most): a smaller one leases per call, first come first served, so the keepers never
    /// hold back the effect workers, the API or the readiness ping.
    package static let minimumPool = 8

    private let client: PostgresClient
    private let limit: Duration
    private let linger: Duration
    private let holder = Mutex<Holder?>(nil)

    package init(client: PostgresClient, limit: Duration = BoundedPostgres.defaultLimit, linger: Duration = KeptConnection.defaultLinger) {
        self.client = client
        self.limit = limit
        self.linger = linger
    }

    /// `body` on the kept connection (leased now if none is kept), answered within `limit` (nil:
    /// the keeper's).
    package func withConnection<Result: Sendable>(
        limit: Duration? = nil, _ body: @escaping @Sendable (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        let holding = Mutex<Holder?>(nil)
        return try await withDeadline(
            limit ?? self.limit,
            submit: { (completion: Completion<Result>) in
                let work = Work(
                    run: { connection in
                        do { completion(.success(try await body(connection))) } catch { completion(.failure(error)) }
                    },
                    fail: { completion(.failure($0)) },
                    isAnswered: { completion.isAnswered })
                holding.withLock { $0 = self.submit(work) }
            },
            expired: { holding.withLock { $0 }.map(self.retire) })
    }

    /// `PostgresClient.transaction` on the kept connection: the closure's own error, or BEGIN's or
    /// COMMIT's, not postgres-nio's wrapper.
    package func transaction<Result: Sendable>(logger: Logger, _ body: @escaping @Sendable (PostgresConnection) async throws -> Result) async throws -> Result {
        try await withConnection { connection in
            do {
                return try await connection.withTransaction(logger: logger) { connection in try await body(connection) }
            } catch let error as PostgresTransactionError {
                // A failed ROLLBACK may leave the transaction open: the connection is not kept
                // (closed, it is leased anew for the next call).
                if error.rollbackError != nil { try? await connection.close() }
                throw error.cause
            }
        }
    }

    /// Gives the connection back once the call in progress (if any) ends.
    package func close() {
        let current = holder.withLock { holder in
            defer { holder = nil }
            return holder
        }
        for work in current?.mailbox.close() ?? [] { work.fail(CancellationError()) }
    }

    /// Hands `work` to the holder of the kept connection, or to a new one (which leases it).
    private func submit(_ work: Work) -> Holder {
        let (chosen, started) = holder.withLock { holder -> (Holder, Bool) in
            if let current = holder, current.mailbox.post(work) { return (current, false) }
            let fresh = Holder()
            _ = fresh.mailbox.post(work)
            holder = fresh
            return (fresh, true)
        }
        if started { start(chosen) }
        return chosen
    }

    /// A call held by `stuck` passed its limit: later calls go to a new holder, with the calls
    /// still waiting in its mailbox.
    private func retire(_ stuck: Holder) {
        holder.withLock { holder in
            if holder === stuck { holder = nil }
        }
        for work in stuck.mailbox.close() where !work.isAnswered() { _ = submit(work) }
    }

    /// Leases a connection and runs the holder's calls on it until `linger` passes without one.
    /// A connection found closed (a database restart) is given back and another leased for the
    /// call; a call that finds three in a row closed fails at once.
    private func start(_ holder: Holder) {
        let (client, linger) = (self.client, self.linger)
        Task {
            var pending: Work? = nil
            var closedInARow = 0
            repeat {
                do {
                    try await client.withConnection { connection in
                        let watch = CloseWatch(connection) { [weak self] in self?.retire(holder) }
                        while true {
                            let next: Work?
                            if let waiting = pending {
                                (next, pending) = (waiting, nil)
                            } else {
                                next = await holder.mailbox.next(within: linger)
                            }
                            guard let work = next else { return }
                            if work.isAnswered() { continue }
                            if connection.isClosed {
                                closedInARow += 1
                                guard closedInARow < 3 else {
                                    work.fail(NoOpenConnection())
                                    closedInARow = 0
                                    continue
                                }
                                pending = work
                                return
                            }
                            closedInARow = 0
                            // A statement postgres-nio loses as the connection closes is failed
                            // by the close, not by the call's limit.
                            guard watch.start(work) else { continue }
                            await work.run(connection)
                            watch.finish()
                        }
                    }
                } catch {
                    // No connection: the call waiting for one fails with the pool's error.
                    pending?.fail(error)
                    pending = nil
                    for work in holder.mailbox.close() { work.fail(error) }
                }
            } while pending != nil
        }
    }

    /// The pool lent three connections in a row that were already closed.
    package struct NoOpenConnection: Error, CustomStringConvertible {
        package var description: String { "the database closed every connection the pool lent (is PostgreSQL restarting?)" }
    }

    /// The connection closed under a call: what it sent may or may not have been done.
    package struct ConnectionClosed: Error, CustomStringConvertible {
        package var description: String { "the database connection closed before the call was answered" }
    }

    /// Fails the call running on a lent connection when that connection closes: postgres-nio 1.33
    /// can drop a statement in flight on a closing connection, and its call would otherwise wait
    /// out its whole limit (a commit slot held for a minute after a failover). One callback per
    /// lease, not per call.
    private final class CloseWatch: Sendable {
        private struct State {
            var running: Work?
            var closed = false
        }
        private let state = Mutex(State())
        private let interrupted: @Sendable () -> Void

        /// `interrupted`: a call was running when the connection closed (its holder, stuck on
        /// it, is retired as at a call's limit).
        init(_ connection: PostgresConnection, interrupted: @escaping @Sendable () -> Void) {
            self.interrupted = interrupted
            connection.closeFuture.whenComplete { [weak self] _ in self?.closed() }
        }

        /// False (and `work` failed) when the connection has closed already.
        func start(_ work: Work) -> Bool {
            let open = state.withLock { state in
                guard !state.closed else { return false }
                state.running = work
                return true
            }
            if !open { work.fail(ConnectionClosed()) }
            return open
        }

        func finish() { state.withLock { $0.running = nil } }

        private func closed() {
            let running = state.withLock { state in
                state.closed = true
                defer { state.running = nil }
                return state.running
            }
            guard let running else { return }
            running.fail(ConnectionClosed())
            interrupted()
        }
    }

    private struct Work: Sendable {
        var run: @Sendable (PostgresConnection) async -> Void
        var fail: @Sendable (any Error) -> Void
        var isAnswered: @Sendable () -> Bool
    }

    private final class Holder: Sendable {
        let mailbox = Mailbox()
    }

    /// The calls waiting for a holder. Closed once it has been quiet for `linger` (or retired),
    /// under the same lock as posting, so no call is posted to a holder that has stopped taking them.
    private final class Mailbox: Sendable {
        private struct State {
            var works: [Work] = []
            var waiter: CheckedContinuation<Work?, Never>?
            /// When the holder last began to wait (its quiet is measured from there).
            var idleSince = ContinuousClock.now
            var timerArmed = false
            var closed = false
        }
        private let state = Mutex(State())

        /// False when closed.
        func post(_ work: Work) -> Bool {
            let (posted, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Work?, Never>?) in
                guard !state.closed else { return (false, nil) }
                guard let waiter = state.waiter else {
                    state.works.append(work)
                    return (true, nil)
                }
                state.waiter = nil
                return (true, waiter)
            }
            waiter?.resume(returning: work)
            return posted
        }

        /// The next call, or nil when closed or after `linger` without one (which closes it). One
        /// timer per mailbox, re-armed lazily: a busy holder does not schedule one per call.
        func next(within linger: Duration) async -> Work? {
            await withCheckedContinuation { (continuation: CheckedContinuation<Work?, Never>) in
                let (ready, arm) = state.withLock { state -> (Work??, Bool) in
                    if !state.works.isEmpty { return (.some(state.works.removeFirst()), false) }
                    if state.closed { return (.some(nil), false) }
                    state.waiter = continuation
                    state.idleSince = .now
                    defer { state.timerArmed = true }
                    return (nil, !state.timerArmed)
                }
                if let ready { return continuation.resume(returning: ready) }
                if arm { armTimer(after: linger, linger: linger) }
            }
        }

        private func armTimer(after delay: Duration, linger: Duration) {
            after(delay) {
                let (quiet, again) = self.state.withLock { state -> (CheckedContinuation<Work?, Never>?, Duration?) in
                    // Busy (no waiter): its next wait arms the timer again.
                    guard let waiter = state.waiter else {
                        state.timerArmed = false
                        return (nil, nil)
                    }
                    let due = state.idleSince + linger
                    guard ContinuousClock.now >= due else { return (nil, due - .now) }
                    state.waiter = nil
                    state.closed = true
                    state.timerArmed = false
                    return (waiter, nil)
                }
                if let again { self.armTimer(after: again, linger: linger) }
                quiet?.resume(returning: nil)
            }
        }

        /// Closes it; returns the calls still waiting, not started.
        func close() -> [Work] {
            let (works, waiter) = state.withLock { state -> ([Work], CheckedContinuation<Work?, Never>?) in
                state.closed = true
                defer { state.works = []; state.waiter = nil }
                return (state.works, state.waiter)
            }
            waiter?.resume(returning: nil)
            return works
        }
    }
}
