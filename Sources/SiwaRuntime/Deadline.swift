import NIOCore
import NIOPosix
import SiwaDomain
import Synchronization

/// Thrown when an operation did not finish within its deadline.
package struct DeadlineExceeded: Error, CustomStringConvertible {
    package let limit: Duration
    package init(limit: Duration) { self.limit = limit }
    package var description: String { "no answer within \(DurationSyntax.format(limit))" }
}

/// Runs `operation` but answers by `limit` at the latest, and at once when the caller is
/// cancelled. The operation is not abandoned at the deadline: it goes on in its own task (a late
/// database commit only makes Apple's retry a duplicate), so a caller never claims success it has
/// not seen and never waits longer than `limit`. The timer is an event-loop scheduled task, not a
/// `Task.sleep`, whose cancelled task would be held until its deadline (BENCHMARKS.md, "Soak").
package func withDeadline<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
    let race = Race<T>()
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let timer = after(limit) { race.finish(.failure(DeadlineExceeded(limit: limit))) }
            let work = Task {
                do {
                    race.finish(.success(try await operation()))
                } catch {
                    race.finish(.failure(error))
                }
                timer.cancel()
            }
            race.set(continuation, work: work)
        }
    } onCancel: {
        race.cancel()
    }
}

/// As `withDeadline`, for an operation another task runs: `submit` hands it a `Completion`, to
/// call once with the operation's result. `expired` runs when the limit passes first (the
/// operation is then still running, or still waiting to start, wherever it was handed).
package func withDeadline<T: Sendable>(
    _ limit: Duration, submit: (Completion<T>) -> Void, expired: @escaping @Sendable () -> Void = {}
) async throws -> T {
    let race = Race<T>()
    let timer = after(limit) {
        if race.finish(.failure(DeadlineExceeded(limit: limit))) { expired() }
    }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            race.set(continuation, work: nil)
            // Cancelled before it was handed over: nothing to start.
            guard !race.isFinished else { return }
            submit(Completion(race: race, timer: timer))
        }
    } onCancel: {
        // The operation may be stuck where it was handed: as at the deadline.
        if race.cancel() {
            timer.cancel()
            expired()
        }
    }
}

/// The answer to a `withDeadline(_:submit:expired:)` caller: the first result given wins.
package struct Completion<T: Sendable>: Sendable {
    fileprivate let race: Race<T>
    fileprivate let timer: Scheduled<Void>

    /// Answers the caller (unless its deadline or cancellation answered it first).
    package func callAsFunction(_ result: Result<T, any Error>) {
        race.finish(result)
        timer.cancel()
    }

    /// The caller has its answer already (a result, its deadline or its cancellation): an
    /// operation not yet started need not start.
    package var isAnswered: Bool { race.isFinished }
}

/// Runs `body` after `delay` on an event loop: a timer that, cancelled, is freed at once (unlike
/// a cancelled `Task.sleep`, see `withDeadline`).
@discardableResult
package func after(_ delay: Duration, _ body: @escaping @Sendable () -> Void) -> Scheduled<Void> {
    MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: TimeAmount(delay), body)
}

/// The first result wins; later ones are dropped. Cancellation is a result too, and may come
/// before the continuation and the operation's task are registered.
fileprivate final class Race<T: Sendable>: Sendable {
    private struct State {
        var result: Result<T, any Error>?
        var waiter: CheckedContinuation<T, any Error>?
        var work: Task<Void, Never>?
        var cancelled = false
    }
    private let state = Mutex(State())

    var isFinished: Bool { state.withLock { $0.result != nil } }

    func set(_ continuation: CheckedContinuation<T, any Error>, work: Task<Void, Never>?) {
        let (ready, cancelled) = state.withLock { state -> (Result<T, any Error>?, Bool) in
            state.work = work
            guard let result = state.result else {
                state.waiter = continuation
                return (nil, false)
            }
            return (result, state.cancelled)
        }
        if cancelled { work?.cancel() }
        if let ready { continuation.resume(with: ready) }
    }

    /// Whether `result` won (was the first).
    @discardableResult
    func finish(_ result: Result<T, any Error>) -> Bool {
        let (won, waiter) = state.withLock { state -> (Bool, CheckedContinuation<T, any Error>?) in
            guard state.result == nil else { return (false, nil) }
            state.result = result
            defer { state.waiter = nil }
            return (true, state.waiter)
        }
        waiter?.resume(with: result)
        return won
    }

    /// Whether the cancellation won (came before any result).
    @discardableResult
    func cancel() -> Bool {
        let (won, waiter, work) = state.withLock { state -> (Bool, CheckedContinuation<T, any Error>?, Task<Void, Never>?) in
            guard state.result == nil else { return (false, nil, nil) }
            state.result = .failure(CancellationError())
            state.cancelled = true
            defer { state.waiter = nil }
            return (true, state.waiter, state.work)
        }
        work?.cancel()
        waiter?.resume(throwing: CancellationError())
        return won
    }
}
