import Foundation
import Hummingbird
import SiwaDomain
import SiwaStore

/// Alerts for on-call engineers and dashboards (`/v1/alerts`, scope `alerts:read`).
package struct AlertsController: Sendable {
    let alerts: AlertStore

    package init(alerts: AlertStore) {
        self.alerts = alerts
    }

    package func register(on group: RouterGroup<SiwaRequestContext>) {
        group.get("alerts", use: list)
    }

    /// Alerts newest first (`state=firing|resolved`, `limit`), with the silences still running.
    @Sendable func list(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.alertsRead)
        let state = QueryParameters(request)["state"].map(String.init)
        if let state, !["firing", "resolved"].contains(state) { throw APIError.invalid("state must be firing or resolved (got \(state))") }
        let limit = try JSONBody.limit(request, default: 100, maximum: ListLimit.maximum)
        let items = try await alerts.list(state: state, limit: limit)
        let silences = try await alerts.silences(includeExpired: false)
        return .json(["items": .array(items.map(\.json)), "silences": .array(silences.map(\.json))])
    }
}
