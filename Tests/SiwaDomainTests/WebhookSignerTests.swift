import Foundation
import SiwaDomain
import Testing

@Suite("Callback signatures (Standard Webhooks)", .timeLimit(.minutes(10)))
struct WebhookSignerTests {
    /// The specification's published vector: a receiver's Standard Webhooks library accepts what
    /// we send only if this comes out byte for byte.
    @Test("reproduces the Standard Webhooks reference test vector")
    func referenceVector() throws {
        let signer = try WebhookSigner(secrets: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let signature = signer.signature(id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8))
        #expect(signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
    }

    @Test("every configured secret signs, in order, so a receiver can rotate without downtime")
    func rotation() throws {
        let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        let new = WebhookSigner.generateSecret()
        let both = try WebhookSigner(secrets: "\(new) \(old)")
        let headers = both.headers(id: "msg_1", timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8))
        #expect(headers.map(\.name) == ["webhook-id", "webhook-timestamp", "webhook-signature"])
        let signatures = headers[2].value.split(separator: " ").map(String.init)
        #expect(signatures.count == 2)
        #expect(signatures[0] == (try WebhookSigner(secrets: new)).signature(id: "msg_1", timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8)))
        #expect(signatures[1] == (try WebhookSigner(secrets: old)).signature(id: "msg_1", timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8)))
        #expect(signatures[0] != signatures[1])
    }

    @Test("a generated secret is whsec_ and the base64 of 32 random bytes")
    func generated() throws {
        let secret = WebhookSigner.generateSecret()
        #expect(secret.hasPrefix("whsec_"))
        #expect(Data(base64Encoded: String(secret.dropFirst(6)))?.count == 32)
        #expect(secret != WebhookSigner.generateSecret())
    }

    @Test("malformed secrets are refused, naming which one and why", arguments: [
        ("", "secret 1 is missing"),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "secret 1 does not start with whsec_"),
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw whsec_!!notbase64", "secret 2 must be whsec_ followed by the base64"),
        ("whsec_c2hvcnQ=", "secret 1 must be whsec_ followed by the base64 of 24 to 64"),
    ])
    func malformed(secrets: String, message: String) {
        #expect {
            _ = try WebhookSigner(secrets: secrets)
        } throws: { error in
            "\(error)".contains(message)
        }
    }
}
