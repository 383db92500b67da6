import NIOCore
import Synchronization

/// Wakes idle workers early: rung on a `siwa_jobs` NOTIFY. Workers never rely on it alone — the
/// listener's check (or, with no listener, their own poll) finds what a lost NOTIFY left.
package final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var closed = false
        var nextID = 0
        var waiters: [Int: Waiter] = [:]
    }

    /// A waiting caller and its timeout timer, cancelled when a ring or close wakes it first (a
    /// loop that waits an hour and is rung 200 times a second must not pile up an hour of timers).
    private struct Waiter {
        var continuation: CheckedContinuation<Void, Never>
        var timer: Scheduled<Void>?
    }
    private let state = Mutex(State())

    package init() {}

    /// Wakes one idle worker (one NOTIFY is usually one small batch: waking every worker would
    /// have them all race for it); a worker that finds a full batch keeps going and others wake on
    /// the next ring or poll.
    package func ring() {
        let waiter = state.withLock { state -> Waiter? in
            guard let id = state.waiters.keys.min() else {
                state.rung = true
                return nil
            }
            return state.waiters.removeValue(forKey: id)
        }
        waiter?.timer?.cancel()
        waiter?.continuation.resume()
    }

    /// Wakes every idle worker, and every later `wait` returns at once (shutdown: a worker that
    /// was between its check for shutdown and its wait would otherwise sleep a whole poll interval).
    package func close() {
        let waiters = state.withLock { state -> [Waiter] in
            state.closed = true
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters {
            waiter.timer?.cancel()
            waiter.continuation.resume()
        }
    }

    /// Wakes every idle waiter once, without closing: their loops look again and choose their
    /// next wait (the listener lost its connection, so they poll again).
    package func wakeAll() {
        let waiters = state.withLock { state -> [Waiter] in
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters {
            waiter.timer?.cancel()
            waiter.continuation.resume()
        }
    }

    /// Whether `close()` was called.
    package var isClosed: Bool { state.withLock { $0.closed } }

    /// Returns when rung (or already rung since the last wait), or closed, or after `timeout`.
    package func wait(timeout: Duration) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let id: Int? = state.withLock { state in
                if state.closed { return nil }
                if state.rung {
                    state.rung = false
                    return nil
                }
                state.nextID += 1
                state.waiters[state.nextID] = Waiter(continuation: continuation)
                return state.nextID
            }
            guard let id else {
                continuation.resume()
                return
            }
            let timer = after(timeout) {
                let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                waiter?.continuation.resume()
            }
            // Woken before the timer was stored: nothing will cancel it but us.
            let woken = state.withLock { state in
                guard state.waiters[id] != nil else { return true }
                state.waiters[id]?.timer = timer
                return false
            }
            if woken { timer.cancel() }
        }
    }

    /// Whether a ring is waiting for the next `wait` (nobody was waiting when it came).
    package var isRung: Bool { state.withLock { $0.rung } }

    /// Callers waiting now.
    package var waiting: Int { state.withLock { $0.waiters.count } }
}
