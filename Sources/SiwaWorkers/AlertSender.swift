import AsyncHTTPClient
import Foundation
import Logging
import SiwaDomain
import SiwaStore

/// Sends an alert message to its sink: webhooks signed with the alerts' own secret, Slack as is.
/// Each message has its own `webhook-id` (`alert_<id>_<kind without alert_>`). A message whose
/// sink is no longer configured is undeliverable, with that reason.
struct AlertSender: DeliverySender {
    let sinks: AlertSinks

    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        guard let (url, signed) = sinks.resolve(delivery.target ?? "") else {
            return .undeliverable(
                error: "sink \(delivery.target ?? "?") is no longer configured (SIWA_ALERT_WEBHOOK_URLS or SIWA_ALERT_SLACK_URL changed)")
        }
        return await WebhookPost.send(
            body: delivery.body, id: webhookID(delivery), to: url, signer: signed ? sinks.signer : nil, timeout: timeout, http: http)
    }

    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata {
        ["webhook_id": "\(webhookID(delivery))", "sink": "\(delivery.target ?? "")"]
    }

    private func webhookID(_ delivery: ClaimedDelivery) -> String {
        "alert_\(delivery.alertID ?? 0)_\(delivery.kind.replacingOccurrences(of: "alert_", with: ""))"
    }
}

extension DeliveryLane {
    /// Lane `alerts`: alert messages to the configured sinks.
    package static func alerts(_ sinks: AlertSinks, retry: RetryPolicy) -> DeliveryLane {
        DeliveryLane(lane: .alerts, sender: AlertSender(sinks: sinks), event: "alert delivery", retry: retry, concurrency: 16, timeout: sinks.timeout)
    }
}
