import Synchronization

/// Which of a process's effect workers claims, so that a steady flow is taken in batches sized by
/// the flow rather than by how many workers were idle. One worker mid-round takes what arrives
/// meanwhile in its next claim; a worker woken then leaves the jobs to it (the wake is passed on,
/// so the busy one claims once more even after an empty claim). Every woken worker claims once a
/// round comes back full (a backlog), or when the latest round began `patience` ago or more
/// (a slow or stalled one must not hold the others back).
package final class EffectCrew: Sendable {
    private struct State {
        var busy = 0
        var backlog = false
        var passedOn = false
        var latestBegin = ContinuousClock.Instant.now
    }
    private let state = Mutex(State())
    private let batchSize: Int
    private let patience: Duration

    package init(batchSize: Int, patience: Duration = .milliseconds(50)) {
        self.batchSize = batchSize
        self.patience = patience
    }

    /// Called by a woken worker before it claims: false when another worker is mid-round, began
    /// within `patience` and has no backlog: it will claim again for this one.
    package func begin(now: ContinuousClock.Instant = .now) -> Bool {
        state.withLock { state in
            if state.busy > 0 && !state.backlog && now - state.latestBegin < patience {
                state.passedOn = true
                return false
            }
            state.busy += 1
            state.latestBegin = now
            return true
        }
    }

    /// Called when a round that `begin` allowed ends, with the jobs it claimed: whether the worker
    /// claims again at once (it claimed some, or a wake was passed on to it meanwhile).
    package func end(claimed: Int) -> Bool {
        state.withLock { state in
            state.busy -= 1
            state.backlog = claimed >= batchSize
            let again = claimed > 0 || state.passedOn
            if again { state.passedOn = false }
            return again
        }
    }

    /// Called when a round that `begin` allowed failed: the worker is no longer mid-round; a
    /// passed-on wake stays for the next round that ends.
    package func abandon() {
        state.withLock { $0.busy -= 1 }
    }
}
