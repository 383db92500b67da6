import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import SiwaDomain
import SiwaStore

/// How the jobs of a delivery lane are sent: the one part of a lane that is code.
package protocol DeliverySender: Sendable {
    /// One attempt at `delivery`; the deliverer records what it returns.
    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome
    /// What its log line says about the delivery (its message id, what it is for).
    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata
}

/// Attempts at one job and the waits between them.
package struct RetryPolicy: Sendable {
    package var maxAttempts: Int
    package var backoff: RetryBackoff

    package init(maxAttempts: Int, backoff: RetryBackoff) {
        self.maxAttempts = maxAttempts
        self.backoff = backoff
    }
}

/// A delivery lane as its `Deliverer` runs it: the queue lane its jobs are in, the sender, and
/// the policy: retries, deliveries in flight at once, one attempt's time limit. Each lane's sender
/// file declares its own (`DeliveryLane.callbacks`, `DeliveryLane.alerts`).
package struct DeliveryLane: Sendable {
    package var lane: Lane
    package var sender: any DeliverySender
    /// What a log line calls one delivery (`callback`, `alert delivery`).
    package var event: String
    package var retry: RetryPolicy
    /// Deliveries claimed, and sent concurrently, in one round.
    package var concurrency: Int
    /// One attempt's limit, connection included; longer counts as a failed attempt.
    package var timeout: Duration

    package init(lane: Lane, sender: any DeliverySender, event: String, retry: RetryPolicy, concurrency: Int, timeout: Duration) {
        self.lane = lane
        self.sender = sender
        self.event = event
        self.retry = retry
        self.concurrency = concurrency
        self.timeout = timeout
    }
}

/// One POST of a webhook message, signed (Standard Webhooks headers) when a signer is given. Any
/// 2xx is delivered; redirects are not followed (a moved endpoint is a configuration error the
/// operator should see).
enum WebhookPost {
    static func send(body: String, id: String, to url: URL, signer: WebhookSigner?, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        let body = Array(body.utf8)
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "user-agent", value: "siwa-events")
        let timestamp = Int64(Date().timeIntervalSince1970)
        for header in signer?.headers(id: id, timestamp: timestamp, body: body) ?? [] {
            request.headers.add(name: header.name, value: header.value)
        }
        request.body = .bytes(body)
        do {
            let response = try await http.execute(request, timeout: .init(timeout))
            // Read (and bound) the answer so the connection can be reused; its content is not kept.
            _ = try? await response.body.collect(upTo: 64 * 1024)
            let status = Int(response.status.code)
            return (200..<300).contains(status) ? .delivered(status: status) : .failed(status: status, error: "HTTP \(status)")
        } catch {
            return .failed(status: nil, error: URLRedaction.scrubbed("\(error)"))
        }
    }
}
