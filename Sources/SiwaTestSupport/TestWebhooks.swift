import Crypto
import Foundation

/// Webhook secrets for tests, and an independent check of a Standard Webhooks signature.
package enum TestWebhooks {
    package static let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    package static let rotated = "whsec_" + Data(repeating: 7, count: 32).base64EncodedString()

    /// Verifies like a receiver's Standard Webhooks library, independently of our signer:
    /// HMAC-SHA256 with the secret's key bytes over "id.timestamp.body", base64, "v1,".
    package static func verifies(_ request: CallbackEndpoint.Received, secret: String) -> Bool {
        guard let id = request.headers["webhook-id"], let timestamp = request.headers["webhook-timestamp"],
            let signatures = request.headers["webhook-signature"],
            let key = Data(base64Encoded: String(secret.dropFirst("whsec_".count)))
        else { return false }
        let expected = "v1," + Data(HMAC<SHA256>.authenticationCode(for: Array("\(id).\(timestamp).".utf8) + request.body, using: SymmetricKey(data: key))).base64EncodedString()
        return signatures.split(separator: " ").contains { $0 == expected }
    }
}
