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
/// Not `Task.sleep`: a cancelled `Task.sleep` keeps its task allocated until its original deadline
/// passes (50,000 cancelled 5 s sleeps held 110 MB for those 5 s), so one per request held
/// rate × limit of memory — most of the RSS growth of the first 10-minute soak at 500/s.
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

/// Runs `body` after `delay` on an event loop: a timer that, cancelled, is freed at once (unlike
/// a cancelled `Task.sleep`, see `withDeadline`).
@discardableResult
package func after(_ delay: Duration, _ body: @escaping @Sendable () -> Void) -> Scheduled<Void> {
    MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: TimeAmount(delay), body)
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
