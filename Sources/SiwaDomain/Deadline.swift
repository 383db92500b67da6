import NIOCore
import NIOPosix
import Synchronization

/// Thrown when an operation did not finish within its deadline.
package struct DeadlineExceeded: Error, CustomStringConvertible {
    package let limit: Duration
    package var description: String { "no answer within \(DurationSyntax.format(limit))" }
}

/// Runs `operation` but answers by `limit` at the latest. The operation is not abandoned half-way:
/// it goes on in its own task (a database commit that lands late only makes Apple's retry a
/// duplicate), so a caller never claims success it has not seen and never waits longer than
/// `limit` — while PostgreSQL is down, postgres-nio's pool would otherwise hold requests for up
/// to a minute before failing them, and a trickling JWKS download would hold a key refresh.
///
/// The timer is a task scheduled on an event loop, cancelled (and freed) when the operation wins.
/// Not `Task.sleep`: on Linux a `Task.sleep` never releases its timer (heaptrack: ≈ 300 bytes per
/// sleep; with one per request that was most of 67 MiB of RSS growth over a 10-minute soak at 500/s).
package func withDeadline<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
    let race = Race<T>()
    return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
        race.set(continuation)
        let timer = after(limit) { race.finish(.failure(DeadlineExceeded(limit: limit))) }
        Task {
            do {
                race.finish(.success(try await operation()))
            } catch {
                race.finish(.failure(error))
            }
            timer.cancel()
        }
    }
}

/// Waits `duration` on an event-loop timer. For the waits that happen per request or per batch:
/// on Linux every `Task.sleep` leaves its timer allocated (heaptrack: ≈ 300 bytes per sleep, freed
/// never), which a server sleeping a few hundred times a second turns into steady RSS growth. Not
/// cancellable: for short waits only.
package func pause(for duration: Duration) async {
    try? await MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: .nanoseconds(duration.nanoseconds)) {}.futureResult.get()
}

/// Runs `body` after `delay` on an event loop (no task, no `Task.sleep`, see `pause`).
@discardableResult
package func after(_ delay: Duration, _ body: @escaping @Sendable () -> Void) -> Scheduled<Void> {
    MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: .nanoseconds(delay.nanoseconds), body)
}

extension Duration {
    fileprivate var nanoseconds: Int64 { components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000 }
}

/// The first result wins; later ones are dropped.
private final class Race<T: Sendable>: Sendable {
    private let state = Mutex<(done: Bool, waiter: CheckedContinuation<T, any Error>?)>((false, nil))

    func set(_ continuation: CheckedContinuation<T, any Error>) {
        state.withLock { $0.waiter = continuation }
    }

    func finish(_ result: Result<T, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<T, any Error>? in
            guard !state.done else { return nil }
            state.done = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result)
    }
}
