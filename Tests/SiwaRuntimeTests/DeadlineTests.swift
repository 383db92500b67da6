import SiwaRuntime
import Synchronization
import Testing

/// `withDeadline`, which every database call goes through (`BoundedPostgres`): the caller's answer
/// never waits on an operation that does not answer.
@Suite("Deadlines: an answer by the limit, and at once when the caller is cancelled")
struct DeadlineTests {
    /// An operation that answers only when opened, deaf to cancellation — as a statement
    /// postgres-nio lost on a closing connection.
    final class Gate: Sendable {
        private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

        func wait() async {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state in
                    if !state.open { state.waiters.append(continuation) }
                    return state.open
                }
                if now { continuation.resume() }
            }
        }

        func open() {
            let waiters = state.withLock { state in
                state.open = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume() }
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
        let finished = Mutex(false)
        await #expect(throws: DeadlineExceeded.self) {
            try await withDeadline(.milliseconds(50)) {
                await gate.wait()
                finished.withLock { $0 = true }
                return 1
            }
        }
        #expect(!finished.withLock { $0 })
        gate.open()
        for _ in 0..<500 where !finished.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
        #expect(finished.withLock { $0 }, "the operation was abandoned, not left to finish")
    }

    @Test("A cancelled caller gets CancellationError at once, even from an operation deaf to cancellation")
    func cancelledWhileWaiting() async throws {
        let gate = Gate()
        let caller = Task { try await withDeadline(.seconds(30)) { await gate.wait(); return 1 } }
        try await Task.sleep(for: .milliseconds(20))
        caller.cancel()
        // Waiting for the operation (or the 30 s limit) would end in DeadlineExceeded instead.
        await #expect(throws: CancellationError.self) { try await caller.value }
        gate.open()
    }

    @Test("A cancelled caller's operation is cancelled too, also when the caller was cancelled before it started")
    func operationCancelled() async throws {
        for delay in [Duration.milliseconds(20), .zero] {
            let sawCancellation = Mutex(false)
            let started = Gate()
            let caller = Task {
                if delay == .zero { withUnsafeCurrentTask { $0?.cancel() } }
                return try await withDeadline(.seconds(30)) {
                    started.open()
                    do {
                        try await Task.sleep(for: .seconds(30))
                    } catch is CancellationError {
                        sawCancellation.withLock { $0 = true }
                    }
                    return 1
                }
            }
            if delay > .zero {
                await started.wait()
                try await Task.sleep(for: delay)
                caller.cancel()
            }
            await #expect(throws: CancellationError.self) { try await caller.value }
            for _ in 0..<500 where !sawCancellation.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
            #expect(sawCancellation.withLock { $0 }, "cancelled \(delay == .zero ? "before the call" : "during the call"): the operation was not cancelled")
        }
    }
}
