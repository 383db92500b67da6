import NIOCore
import NIOPosix
import SiwaRuntime
import Testing

@Suite("Doorbell: a ring wakes one waiter, and leaves no timer behind", .timeLimit(.minutes(10)))
struct DoorbellTests {
    @Test("A wait woken by a ring cancels its timeout timer: nothing is left holding the doorbell for the hour it waited")
    func ringCancelsTimer() async throws {
        weak var released: Doorbell?
        do {
            let doorbell = Doorbell()
            released = doorbell
            for _ in 0..<100 {
                async let woken: Void = doorbell.wait(timeout: .seconds(3600))
                while doorbell.waiting == 0 { await Task.yield() }
                doorbell.ring()
                await woken
            }
        }
        // Cancellations run on the timers' event loops: let every loop go round once.
        for loop in MultiThreadedEventLoopGroup.singleton.makeIterator() {
            try await loop.submit {}.get()
        }
        #expect(released == nil, "a timer still scheduled holds the doorbell")
    }
}
