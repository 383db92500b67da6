import Crypto
import Foundation

/// Signs outgoing callbacks per the Standard Webhooks specification
/// (https://www.standardwebhooks.com), so that a backend verifies them with any of its
/// libraries:
///
/// - `webhook-id`: the message's id, the same on every retry and redelivery (an idempotency key);
/// - `webhook-timestamp`: seconds since the epoch at this attempt (receivers refuse old ones);
/// - `webhook-signature`: `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, one per
///   secret, space-separated — every configured secret signs, so a receiver can move from the old
///   secret to the new one while both are accepted, without downtime.
///
/// Secrets are written `whsec_<base64 key>` (the key is what HMAC uses, not the text).
package struct WebhookSigner: Sendable {
    package struct InvalidSecret: Error, Sendable, CustomStringConvertible {
        package var position: Int
        package var problem: String
        package var description: String { "secret \(position) \(problem)" }
    }

    private let keys: [SymmetricKey]

    /// `secrets`: one or more space-separated `whsec_…` secrets (as `SIWA_CALLBACK_SECRET` holds them).
    package init(secrets: String) throws(InvalidSecret) {
        let parts = secrets.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
        guard !parts.isEmpty else { throw InvalidSecret(position: 1, problem: "is missing: give at least one whsec_… secret") }
        var keys: [SymmetricKey] = []
        for (index, part) in parts.enumerated() {
            guard part.hasPrefix("whsec_") else {
                throw InvalidSecret(position: index + 1, problem: "does not start with whsec_ (generate one with `siwa-events callbacks secret`)")
            }
            guard let bytes = Data(base64Encoded: String(part.dropFirst("whsec_".count))), bytes.count >= 24, bytes.count <= 64 else {
                throw InvalidSecret(position: index + 1, problem: "must be whsec_ followed by the base64 of 24 to 64 random bytes")
            }
            keys.append(SymmetricKey(data: bytes))
        }
        self.keys = keys
    }

    /// A new secret: `whsec_` + base64 of 32 random bytes.
    package static func generateSecret() -> String {
        "whsec_" + SymmetricKey(size: .bits256).withUnsafeBytes { Data($0).base64EncodedString() }
    }

    /// The three headers of one delivery attempt.
    package func headers(id: String, timestamp: Int64, body: [UInt8]) -> [(name: String, value: String)] {
        [("webhook-id", id), ("webhook-timestamp", String(timestamp)), ("webhook-signature", signature(id: id, timestamp: timestamp, body: body))]
    }

    /// `v1,<sig>` for every secret, space-separated.
    package func signature(id: String, timestamp: Int64, body: [UInt8]) -> String {
        var signed = Array("\(id).\(timestamp).".utf8)
        signed.append(contentsOf: body)
        return keys.map { key in
            "v1," + Data(HMAC<SHA256>.authenticationCode(for: signed, using: key)).base64EncodedString()
        }.joined(separator: " ")
    }
}
