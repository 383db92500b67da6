import Foundation

/// Apple's window for an app transfer: for 60 days from the transfer both teams can exchange
/// identifiers at `/auth/usermigrationinfo`, and identity tokens carry `transfer_sub`; after it,
/// the endpoint and the claim are gone for that transfer.
package struct TransferWindow: Sendable, Equatable {
    package static let length: TimeInterval = 60 * 86_400

    package var transferredAt: Date

    package init(transferredAt: Date) { self.transferredAt = transferredAt }

    package var closesAt: Date { transferredAt.addingTimeInterval(Self.length) }

    /// Days left at `now`, the day under way counted: 60 on the transfer's day, 1 on its last,
    /// 0 once it closed (as a person counts them; Apple's window is "60 days").
    package func daysLeft(at now: Date) -> Int {
        max(0, Int((closesAt.timeIntervalSince(now) / 86_400).rounded(.up)))
    }

    package func isOpen(at now: Date) -> Bool { now < closesAt }
}
