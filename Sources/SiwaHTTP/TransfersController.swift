import Foundation
import Hummingbird
import SiwaDomain
import SiwaStore

/// App transfers between developer teams for backend teams and dashboards (`/v1/transfers`,
/// scope `accounts:read`): each transfer's progress and the days left in Apple's 60-day window.
package struct TransfersController: Sendable {
    let transfers: TransferStore
    let clock: @Sendable () -> Date

    package init(transfers: TransferStore, clock: @escaping @Sendable () -> Date = { Date() }) {
        self.transfers = transfers
        self.clock = clock
    }

    package func register(on group: RouterGroup<SiwaRequestContext>) {
        group.get("transfers", use: list)
    }

    /// Every recorded transfer, newest first: outgoing ones count transfer_subs, incoming ones
    /// exchanges; `users_left` is what still needs Apple before the window closes.
    @Sendable func list(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.accountsRead)
        let now = clock()
        var items: [JSONValue] = []
        for transfer in try await transfers.list() {
            let window = TransferWindow(transferredAt: transfer.transferredAt)
            var item: [String: JSONValue] = [
                "id": .number(Double(transfer.id)), "direction": .string(transfer.direction.rawValue), "client_id": .string(transfer.clientID),
                "aud": .string(transfer.aud), "team_id": .string(transfer.teamID), "transferred_at": .string(iso8601(transfer.transferredAt)),
                "window_closes_at": .string(iso8601(window.closesAt)), "window_open": .bool(window.isOpen(at: now)),
                "days_left": .number(Double(window.daysLeft(at: now))),
            ]
            switch transfer.direction {
            case .outgoing:
                let progress = try await transfers.progress(of: transfer)
                item["users"] = .number(Double(progress.total))
                item["done"] = .number(Double(progress.computed))
                item["refused"] = .object(progress.failed.mapValues { .number(Double($0)) })
                item["users_left"] = .number(Double(progress.pending))
            case .incoming:
                let progress = try await transfers.importProgress(of: transfer)
                item["users"] = .number(Double(progress.total))
                item["done"] = .number(Double(progress.exchanged))
                item["rekeyed"] = .number(Double(progress.rekeyed))
                item["refused"] = .object(progress.failed.mapValues { .number(Double($0)) })
                item["users_left"] = .number(Double(progress.pending))
            }
            items.append(.object(item))
        }
        return .json(["items": .array(items)])
    }
}
