import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import SiwaDomain
import SiwaStore

/// The mail providers whose suppression lists siwa-events keeps (`SIWA_SUPPRESSION_TARGETS`),
/// each with its account and base URL (which may carry a path), and the apps whose addresses they
/// may be sent (`SIWA_APPLE_BUNDLE_IDS`: never another app's).
package struct MailProviders: Sendable {
    package struct Provider: Sendable {
        package var account: MailProviderAccount
        package var baseURL: URL

        package init(account: MailProviderAccount, baseURL: URL) {
            self.account = account
            self.baseURL = baseURL
        }
    }

    package var providers: [Provider]
    package var apps: Set<String>
    /// Operations in flight at once per provider.
    package var concurrency = 8
    package var timeout: Duration = .seconds(10)

    package init(providers: [Provider], apps: Set<String>) {
        self.providers = providers
        self.apps = apps
    }

    package var targets: [SuppressionTarget] { providers.map(\.account.target) }
}

/// Suppresses (or lifts) one address at one provider: the job's `kind` is the action, `target`
/// the address, `payload` the reason. The request is the provider's documented one
/// (`MailSuppressionAPI`); a lift of an address it does not hold is done; a 429's `Retry-After`
/// is kept. The address never reaches a log line: the provider's words are scrubbed of it.
struct SuppressionSender: DeliverySender {
    let provider: MailProviders.Provider
    let apps: Set<String>

    func send(_ delivery: ClaimedDelivery, timeout: Duration, http: HTTPClient) async -> DeliveryOutcome {
        guard let aud = delivery.aud, let address = delivery.target, let action = SuppressionAction(rawValue: delivery.kind) else {
            return .undeliverable(error: "the job names no app, address or action")
        }
        guard apps.contains(aud) else { return .undeliverable(error: "app \(aud) is not in SIWA_APPLE_BUNDLE_IDS: its addresses are never sent") }
        let base = provider.baseURL
        let basePath = base.path.hasSuffix("/") ? String(base.path.dropLast()) : base.path
        let host = base.port.map { "\(base.host ?? ""):\($0)" } ?? (base.host ?? "")
        let call = MailSuppressionAPI.request(action, address: address, account: provider.account, basePath: basePath, host: host, date: Date())
        var request = HTTPClientRequest(url: "\(base.scheme ?? "https")://\(host)\(basePath)\(call.path)")
        request.method = HTTPMethod(rawValue: call.method)
        for (name, value) in call.headers.sorted(by: { $0.key < $1.key }) { request.headers.add(name: name, value: value) }
        if !call.body.isEmpty { request.body = .bytes(call.body) }
        let scrub = { (text: String) in Self.scrubbed(text, address: address) }
        do {
            let response = try await http.execute(request, timeout: .init(timeout))
            let body = (try? await response.body.collect(upTo: 64 * 1024)).map { String(buffer: $0) } ?? ""
            let status = Int(response.status.code)
            switch MailSuppressionAPI.verdict(action, target: provider.account.target, status: status, body: body, retryAfter: response.headers.first(name: "retry-after")) {
            case .done: return .delivered(status: status)
            case .failed(let words, let retryAfter?): return .throttled(status: status, error: scrub(words), retryAfter: retryAfter)
            case .failed(let words, nil): return .failed(status: status, error: scrub(words))
            }
        } catch {
            return .failed(status: nil, error: scrub(URLRedaction.scrubbed("\(error)")))
        }
    }

    /// `text` with the address (plain or percent-encoded, any case) replaced by `<address>`.
    static func scrubbed(_ text: String, address: String) -> String {
        var text = text
        for form in [address, MailSuppressionAPI.pathSegment(address)] where !form.isEmpty {
            text = text.replacingOccurrences(of: form, with: "<address>", options: .caseInsensitive)
        }
        return text
    }

    func metadata(_ delivery: ClaimedDelivery) -> Logger.Metadata {
        ["provider": "\(provider.account.target.rawValue)", "aud": "\(delivery.aud ?? "")", "action": "\(delivery.kind)"]
    }
}

extension DeliveryLane {
    /// Lane `suppressions_<provider>`: an address's suppressions and lifts at one mail provider.
    package static func suppressions(_ provider: MailProviders.Provider, of providers: MailProviders, retry: RetryPolicy) -> DeliveryLane {
        DeliveryLane(
            lane: .suppressions(provider.account.target), sender: SuppressionSender(provider: provider, apps: providers.apps),
            event: "suppression at \(provider.account.target.rawValue)", retry: retry, concurrency: providers.concurrency, timeout: providers.timeout)
    }
}
