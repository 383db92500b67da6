import SiwaRuntime
import Synchronization
import Testing

/// `withDeadline`, which every database call goes through (`BoundedPostgres`): the caller's answer
/// never waits on an operation that does not answer.
/// Waits for a task to reach a point (`started`, `sawCancellation`) are unbounded: how soon a new
/// task runs depends on what else holds the cooperative pool (two threads here), so a wall-clock
/// bound failed under a parallel build. The suite's time limit stops a hang instead.
@Suite("Deadlines: an answer by the limit, and at once when the caller is cancelled", .timeLimit(.minutes(1)))
struct DeadlineTests {
    /// An operation that answers only when opened, deaf to cancellation — as a statement
    /// postgres-nio lost on a closing connection. Also what a test waits on for an operation to
    /// reach a point (`wait(within:)`: bounded, false at the limit).
    final class Gate: Sendable {
        private let state = Mutex<(open: Bool, next: Int, waiters: [(id: Int, continuation: CheckedContinuation<Bool, Never>)])>((false, 0, []))

        func wait() async { _ = await wait(within: nil) }

        /// Whether the gate opens within `limit` (nil: no limit).
        func wait(within limit: Duration?) async -> Bool {
            await withCheckedContinuation { continuation in
                let id = state.withLock { state -> Int? in
                    if state.open { return nil }
                    state.next += 1
                    state.waiters.append((state.next, continuation))
                    return state.next
                }
                guard let id else { return continuation.resume(returning: true) }
                if let limit {
                    after(limit) { [self] in
                        let expired = state.withLock { state -> CheckedContinuation<Bool, Never>? in
                            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                            return state.waiters.remove(at: index).continuation
                        }
                        expired?.resume(returning: false)
                    }
                }
            }
        }

        func open() {
            let waiters = state.withLock { state in
                state.open = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.continuation.resume(returning: true) }
        }
    }

    struct Refused: Error {}

    @Test("The operation's value, or its error, when it answers within the limit")
    func answers() async throws {
        #expect(try await withDeadline(.seconds(30)) { 42 } == 42)
        await #expect(throws: Refused.self) { try await withDeadline(.seconds(30)) { () async throws -> Int in throw Refused() } }
    }

    @Test("An operation that does not answer: DeadlineExceeded at the limit, while the operation goes on to finish")
    func deadline() async throws {
        let gate = Gate()
        let finished = Gate()
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(50)) {
                await gate.wait()
                finished.open()
                return 1
            }
        }
        #expect(!(await finished.wait(within: .zero)))
        gate.open()
        await finished.wait()  // abandoned, not left to finish, it would never open: the time limit ends the test
    }

    @Test("A cancelled caller gets CancellationError at once, even from an operation deaf to cancellation")
    func cancelledWhileWaiting() async throws {
        let (gate, started) = (Gate(), Gate())
        let caller = Task {
            try await withDeadline(.seconds(30)) {
                started.open()
                await gate.wait()
                return 1
            }
        }
        await started.wait()  // the caller waits on it now
        caller.cancel()
        // Waiting for the operation (or the 30 s limit) would end in DeadlineExceeded instead.
        await #expect(throws: CancellationError.self) { try await caller.value }
        gate.open()
    }

    @Test("A cancelled caller's operation is cancelled too, also when the caller was cancelled before it started")
    func operationCancelled() async throws {
        for before in [false, true] {
            let sawCancellation = Gate()
            let started = Gate()
            let caller = Task {
                if before { withUnsafeCurrentTask { $0?.cancel() } }
                return try await withDeadline(.seconds(30)) {
                    started.open()
                    do {
                        // The operation's own work: 30 s unless cancelled (the test never waits it out).
                        try await Task.sleep(for: .seconds(30))
                    } catch is CancellationError {
                        sawCancellation.open()
                    }
                    return 1
                }
            }
            if !before {
                await started.wait()
                caller.cancel()
            }
            await #expect(throws: CancellationError.self) { try await caller.value }
            // Not cancelled, the operation would sleep its 30 s and never open this: the time limit ends the test.
            await sawCancellation.wait()
        }
    }
}
