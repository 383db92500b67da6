import Synchronization

/// Wakes idle workers early: rung on a `siwa_jobs` NOTIFY. Workers never rely on it — they also
/// wake every poll interval — so a lost NOTIFY (nobody listening, a pooler) costs latency only.
package final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var closed = false
        var nextID = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    }
    private let state = Mutex(State())

    package init() {}

    /// Wakes one idle worker (one NOTIFY is usually one small batch: waking every worker would
    /// have them all race for it); a worker that finds a full batch keeps going and others wake on
    /// the next ring or poll.
    package func ring() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let id = state.waiters.keys.min() else {
                state.rung = true
                return nil
            }
            return state.waiters.removeValue(forKey: id)
        }
        waiter?.resume()
    }

    /// Wakes every idle worker, and every later `wait` returns at once (shutdown: a worker that
    /// was between its check for shutdown and its wait would otherwise sleep a whole poll interval).
    package func close() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.closed = true
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

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
                state.waiters[state.nextID] = continuation
                return state.nextID
            }
            guard let id else {
                continuation.resume()
                return
            }
            after(timeout) {
                let waiter = self.state.withLock { $0.waiters.removeValue(forKey: id) }
                waiter?.resume()
            }
        }
    }
}
