import AsyncHTTPClient
import Foundation
import Logging
import SiwaDomain
import SiwaStore

/// The backend's callback endpoint (`SIWA_CALLBACK_URL`, `SIWA_CALLBACK_SECRET`).
package struct Callbacks: Sendable {
    package var url: URL
    package var signer: WebhookSigner
    /// One attempt's limit, connection included; longer counts as a failed attempt.
    package var timeout = Callbacks.defaultTimeout
    /// Callbacks in flight at once (one claimed batch).
    package var concurrency = Callbacks.defaultConcurrency

    package static let defaultTimeout: Duration = .seconds(10)
    package static let defaultConcurrency = 16

    package init(url: URL, signer: WebhookSigner) {
        self.url = url
        self.signer = signer
    }
}

/// Sends an applied effect's callback to the backend, signed, under the `webhook-id` of its
/// notification (`msg_<n>`), the same on every retry and redelivery.
struct CallbackSender: DeliverySender {
    let callbacks: Callbacks

    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        await WebhookPost.send(body: delivery.body, id: webhookID(delivery), to: callbacks.url, signer: callbacks.signer, timeout: timeout, http: http)
    }

    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata {
        ["webhook_id": "\(webhookID(delivery))", "jti": "\(delivery.jti)"]
    }

    private func webhookID(_ delivery: ClaimedDelivery) -> String { JobQueue.webhookID(notificationID: delivery.notificationID ?? 0) }
}

extension DeliveryLane {
    /// Lane `callbacks`: applied effects to the backend's endpoint.
    package static func callbacks(_ callbacks: Callbacks, retry: RetryPolicy) -> DeliveryLane {
        DeliveryLane(
            lane: .callbacks, sender: CallbackSender(callbacks: callbacks), event: "callback", retry: retry, concurrency: callbacks.concurrency,
            timeout: callbacks.timeout)
    }
}
