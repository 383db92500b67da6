import ServiceLifecycle
import Synchronization

/// Opens once. A service wrapped in `GatedService` starts only when it opens: the effect workers
/// and the alert evaluator wait for the migrations the application applies before it binds
/// (on a first start each worker used to log `relation "jobs" does not exist` until then).
package final class StartGate: Sendable {
    private struct State {
        var isOpen = false
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextID = 0
    }
    private let state = Mutex(State())

    package init() {}

    package func open() {
        let waiters = state.withLock { state in
            state.isOpen = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    package var isOpen: Bool { state.withLock { $0.isOpen } }

    /// Returns when the gate opens, or when the task is cancelled.
    package func wait() async {
        let id = state.withLock { state in
            state.nextID += 1
            return state.nextID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state in
                    if state.isOpen || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }
}

/// `service`, started once `gate` opens; never started if the process is stopping by then.
package struct GatedService: Service {
    let gate: StartGate
    let service: any Service

    package init(gate: StartGate, service: any Service) {
        self.gate = gate
        self.service = service
    }

    package func run() async throws {
        await cancelWhenGracefulShutdown { await gate.wait() }
        if Task.isCancelled || Task.isShuttingDownGracefully { return }
        try await service.run()
    }
}
