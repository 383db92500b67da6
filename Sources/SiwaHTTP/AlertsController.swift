import Foundation
import Hummingbird
import SiwaDomain
import SiwaStore

/// Alerts for on-call engineers and dashboards (`/v1/alerts`, scope `alerts:read`).
package struct AlertsController: Sendable {
    let alerts: AlertStore
    let silences: AlertSilenceStore

    package init(alerts: AlertStore) {
        self.alerts = alerts
        silences = AlertSilenceStore(client: alerts.client, logger: alerts.logger)
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
        let running = try await silences.silences(includeExpired: false)
        return .json(["items": .array(items.map(\.json)), "silences": .array(running.map(\.json))])
    }
}
