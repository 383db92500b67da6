import Foundation

/// Apple's window for an app transfer: for 60 days from the transfer both teams can exchange
/// identifiers at `/auth/usermigrationinfo`, and identity tokens carry `transfer_sub`; after it,
/// the endpoint and the claim are gone for that transfer.
package struct TransferWindow: Sendable, Equatable {
    package static let length: TimeInterval = 60 * 86_400

    package var transferredAt: Date

    package init(transferredAt: Date) { self.transferredAt = transferredAt }

    package var closesAt: Date { transferredAt.addingTimeInterval(Self.length) }

    /// Whole days left at `now` (0 on the last day and after it closed).
    package func daysLeft(at now: Date) -> Int {
        max(0, Int((closesAt.timeIntervalSince(now) / 86_400).rounded(.down)))
    }

    package func isOpen(at now: Date) -> Bool { now < closesAt }
}
