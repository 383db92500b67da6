import SiwaRuntime
import Synchronization

/// A count a test waits on instead of polling: `wait(until:within:)` returns true once the count
/// reaches the target, false when `close()` says no more will come or the limit passes, so a load
/// that stalls fails the test with a message instead of spinning forever.
package final class Progress: Sendable {
    private struct State {
        var value = 0
        var closed = false
        var nextWaiter = 0
        var waiters: [(id: Int, target: Int, continuation: CheckedContinuation<Bool, Never>)] = []
    }

    private let state = Mutex(State())

    package init() {}

    package var value: Int { state.withLock { $0.value } }

    package func add(_ amount: Int = 1) {
        let ready = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.value += amount
            let value = state.value
            let ready = state.waiters.filter { $0.target <= value }.map(\.continuation)
            state.waiters.removeAll { $0.target <= value }
            return ready
        }
        for waiter in ready { waiter.resume(returning: true) }
    }

    /// No more increments: every waiter still short of its target gets false.
    package func close() {
        let waiting = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.closed = true
            defer { state.waiters = [] }
            return state.waiters.map(\.continuation)
        }
        for waiter in waiting { waiter.resume(returning: false) }
    }

    package func wait(until target: Int, within limit: Duration = .seconds(120)) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let id = state.withLock { state -> Int? in
                if state.value >= target || state.closed { return nil }
                state.nextWaiter += 1
                state.waiters.append((state.nextWaiter, target, continuation))
                return state.nextWaiter
            }
            guard let id else { return continuation.resume(returning: value >= target) }
            after(limit) { [self] in
                let expired = self.state.withLock { state -> CheckedContinuation<Bool, Never>? in
                    guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: index).continuation
                }
                expired?.resume(returning: false)
            }
        }
    }
}
