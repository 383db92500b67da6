import Foundation
import SiwaDomain

/// What the mail providers' stand-in holds: each provider's suppression list, every request it
/// was sent (bounded, oldest dropped first) with the verdict of its shape check, and a failure
/// switch per provider (the next `count` requests answer `status`, with `Retry-After` if given).
struct MailLedger: Sendable {
    /// The credentials the stand-in accepts (the README's and the tests' settings).
    static let postmarkToken = "standin-postmark-token"
    static let sendgridKey = "standin-sendgrid-key"
    static let mailgunKey = "standin-mailgun-key"
    static let mailgunDomain = "mg.example.com"
    static let resendKey = "standin-resend-key"
    static let awsAccessKeyID = "AKIDSTANDIN"
    static let awsSecretAccessKey = "standin/secret/access/key"
    static let sesRegion = "us-east-1"

    struct Failure: Sendable {
        var remaining: Int
        var status: Int
        var retryAfter: Int?
    }

    /// One request as the stand-in saw it: what a test compares with each provider's documented shape.
    struct Request: Sendable {
        var provider: SuppressionTarget
        var method: String
        var path: String
        var headers: [String: String]
        var body: String
        var status: Int
        /// Why the shape check refused it (nil: accepted).
        var refused: String?

        var json: JSONValue {
            [
                "provider": .string(provider.rawValue), "method": .string(method), "path": .string(path),
                "headers": .object(headers.mapValues { .string($0) }), "body": .string(body), "status": .number(Double(status)),
                "refused": refused.map { .string($0) } ?? .null,
            ]
        }
    }

    static let maximumRequests = 10_000
    static let maximumAddresses = 1_000_000

    private(set) var suppressed: [SuppressionTarget: Set<String>] = [:]
    private(set) var requests: [Request] = []
    private var failures: [SuppressionTarget: Failure] = [:]

    mutating func record(_ request: Request) {
        requests.append(request)
        if requests.count > Self.maximumRequests { requests.removeFirst(requests.count - Self.maximumRequests) }
    }

    /// The switched failure for the next request to `provider`, if any (and counts it).
    mutating func nextFailure(_ provider: SuppressionTarget) -> Failure? {
        guard var failure = failures[provider], failure.remaining > 0 else { return nil }
        failure.remaining -= 1
        failures[provider] = failure
        return failure
    }

    mutating func failNext(_ count: Int, of provider: SuppressionTarget, status: Int, retryAfter: Int?) {
        failures[provider] = Failure(remaining: count, status: status, retryAfter: retryAfter)
    }

    /// Adds `address`; false when the list is full.
    mutating func suppress(_ address: String, at provider: SuppressionTarget) -> Bool {
        guard (suppressed[provider]?.count ?? 0) < Self.maximumAddresses else { return false }
        suppressed[provider, default: []].insert(address.lowercased())
        return true
    }

    /// Removes `address`; false when it was not held.
    mutating func lift(_ address: String, at provider: SuppressionTarget) -> Bool {
        suppressed[provider]?.remove(address.lowercased()) != nil
    }
}
