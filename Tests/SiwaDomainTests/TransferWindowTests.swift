import Foundation
import SiwaDomain
import Testing

@Suite("Transfer window: Apple's 60 days from the transfer", .timeLimit(.minutes(10)))
struct TransferWindowTests {
    static let transferred = Date(timeIntervalSince1970: 1_767_225_600)  // 2026-01-01T00:00:00Z

    @Test("days left count the day under way (60 all through the transfer day, 1 on the last), 60 days after the transfer; closed from then on")
    func daysLeft() {
        let window = TransferWindow(transferredAt: Self.transferred)
        #expect(window.closesAt == Date(timeIntervalSince1970: 1_767_225_600 + 60 * 86_400))
        #expect(window.daysLeft(at: Self.transferred) == 60)
        #expect(window.daysLeft(at: Self.transferred.addingTimeInterval(0.5 * 86_400)) == 60)
        #expect(window.daysLeft(at: Self.transferred.addingTimeInterval(10.5 * 86_400)) == 50)
        #expect(window.isOpen(at: window.closesAt.addingTimeInterval(-1)))
        #expect(window.daysLeft(at: window.closesAt.addingTimeInterval(-1)) == 1)
        #expect(!window.isOpen(at: window.closesAt))
        #expect(window.daysLeft(at: window.closesAt.addingTimeInterval(86_400 * 5)) == 0)
    }
}
