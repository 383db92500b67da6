import Foundation

/// A mail provider account siwa-events keeps a suppression list of, with its credentials.
package enum MailProviderAccount: Sendable {
    case postmark(token: String, stream: String)
    case sendgrid(apiKey: String)
    case mailgun(apiKey: String, domain: String)
    case resend(apiKey: String)
    case ses(AWSSignatureV4)

    package var target: SuppressionTarget {
        switch self {
        case .postmark: .postmark
        case .sendgrid: .sendgrid
        case .mailgun: .mailgun
        case .resend: .resend
        case .ses: .ses
        }
    }
}

/// One HTTP request to a provider, before it is sent.
package struct MailProviderRequest: Sendable, Equatable {
    package var method: String
    /// The path below the account's base URL (which may carry a path of its own), encoded.
    package var path: String
    package var headers: [String: String]
    package var body: [UInt8]
}

/// What a provider's answer means for the operation.
package enum MailProviderVerdict: Sendable, Equatable {
    case done
    /// Try again later; `retryAfter` when the provider said when (429 `Retry-After`).
    case failed(String, retryAfter: Duration? = nil)
}

/// The suppression calls of each provider, as its public API documents them (the stand-in checks
/// each byte; sources in docs/reference.md): add an address, remove it, and what an answer means
/// (the provider's own error words kept). Pure: the sender sends and signs nothing here but SES.
package enum MailSuppressionAPI {
    /// The request that applies `action` to `address` at `account` (`date`: SES's signing time).
    package static func request(
        _ action: SuppressionAction, address: String, account: MailProviderAccount, basePath: String, host: String, date: Date
    ) -> MailProviderRequest {
        let encoded = pathSegment(address)
        var json: [String: String] = ["accept": "application/json", "content-type": "application/json", "user-agent": "siwa-events"]
        switch account {
        case .postmark(let token, let stream):
            json["x-postmark-server-token"] = token
            let path = "/message-streams/\(pathSegment(stream))/suppressions" + (action == .lift ? "/delete" : "")
            return MailProviderRequest(method: "POST", path: path, headers: json, body: body(["Suppressions": .array([.object(["EmailAddress": .string(address)])])]))
        case .sendgrid(let key):
            json["authorization"] = "Bearer \(key)"
            return action == .suppress
                ? MailProviderRequest(method: "POST", path: "/v3/asm/suppressions/global", headers: json, body: body(["recipient_emails": .array([.string(address)])]))
                : MailProviderRequest(method: "DELETE", path: "/v3/asm/suppressions/global/\(encoded)", headers: json.filter { $0.key != "content-type" }, body: [])
        case .mailgun(let key, let domain):
            json["authorization"] = "Basic " + Data("api:\(key)".utf8).base64EncodedString()
            let bounces = "/v3/\(pathSegment(domain))/bounces"
            return action == .suppress
                ? MailProviderRequest(
                    method: "POST", path: bounces, headers: json,
                    body: Array(JSONValue.array([.object(["address": .string(address), "code": .string("550"), "error": .string(mailgunError)])]).jsonText.utf8))
                : MailProviderRequest(method: "DELETE", path: "\(bounces)/\(encoded)", headers: json.filter { $0.key != "content-type" }, body: [])
        case .resend(let key):
            json["authorization"] = "Bearer \(key)"
            return action == .suppress
                ? MailProviderRequest(method: "POST", path: "/suppressions", headers: json, body: body(["email": .string(address)]))
                : MailProviderRequest(method: "DELETE", path: "/suppressions/\(encoded)", headers: json.filter { $0.key != "content-type" }, body: [])
        case .ses(let signer):
            var request =
                action == .suppress
                ? MailProviderRequest(
                    method: "PUT", path: "/v2/email/suppression/addresses", headers: json,
                    body: body(["EmailAddress": .string(address), "Reason": .string("BOUNCE")]))
                : MailProviderRequest(method: "DELETE", path: "/v2/email/suppression/addresses/\(encoded)", headers: json.filter { $0.key != "content-type" }, body: [])
            request.headers["host"] = host
            let signed = signer.signedHeaders(
                method: request.method, path: basePath + request.path, headers: request.headers.map { ($0.key, $0.value) }, payload: request.body, date: date)
            for (name, value) in signed { request.headers[name] = value }
            request.headers["host"] = nil  // the HTTP client sets it, to the same value
            return request
        }
    }

    /// What Mailgun's bounce record says (its `error` field).
    static let mailgunError = "siwa-events: Sign in with Apple stopped forwarding to this address"

    /// What `status` (and the answer's `body`, `retryAfter` header) means for `action` at `target`.
    /// A lift of an address the provider does not hold is done; a 429 says when to come back.
    package static func verdict(
        _ action: SuppressionAction, target: SuppressionTarget, status: Int, body: String, retryAfter: String?
    ) -> MailProviderVerdict {
        let words = providerWords(body)
        if status == 429 {
            return .failed("HTTP 429 (rate limited)\(words.map { ": \($0)" } ?? "")", retryAfter: retryAfter.flatMap(parseRetryAfter))
        }
        if action == .lift && status == 404 { return .done }
        guard (200..<300).contains(status) else { return .failed("HTTP \(status)\(words.map { ": \($0)" } ?? "")") }
        // Postmark answers 200 with a status per address: "Failed" is a failure in a 200.
        if target == .postmark, let items = JSONValue.parse(Array(body.utf8))?["Suppressions"]?.arrayValue {
            for item in items where item["Status"]?.stringValue == "Failed" {
                return .failed("Postmark: Failed: \(UntrustedText.bounded(item["Message"]?.stringValue ?? "no message", limit: 300))")
            }
        }
        return .done
    }

    /// The provider's own error words, bounded: `message`/`Message`, or SendGrid's `errors[].message`.
    static func providerWords(_ body: String) -> String? {
        guard !body.isEmpty else { return nil }
        if let root = JSONValue.parse(Array(body.utf8)) {
            for key in ["message", "Message", "error"] {
                if let text = root[key]?.stringValue { return UntrustedText.bounded(text, limit: 300) as String }
            }
            let texts = root["errors"]?.arrayValue?.compactMap { $0["message"]?.stringValue } ?? []
            if !texts.isEmpty { return UntrustedText.bounded(texts.joined(separator: "; "), limit: 300) as String }
        }
        return UntrustedText.bounded(body, limit: 200) as String
    }

    /// `Retry-After` in seconds (an HTTP date is not honoured: the backoff applies), at most an hour.
    static func parseRetryAfter(_ text: String) -> Duration? {
        guard let seconds = Int(text.trimmingCharacters(in: .whitespaces)), seconds >= 0 else { return nil }
        return .seconds(min(seconds, 3600))
    }

    static func body(_ object: [String: JSONValue]) -> [UInt8] { Array(JSONValue.object(object).jsonText.utf8) }

    /// One path segment, encoded: every byte but RFC 3986's unreserved ones (so `@` is `%40`).
    package static func pathSegment(_ text: String) -> String { AWSSignatureV4.encode(text) }
}
