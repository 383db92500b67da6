import Crypto
import Foundation
import SiwaDomain
import Testing

/// AWS's published Signature Version 4 examples: the test suite's `get-vanilla` and
/// `post-vanilla` (awslabs/aws-c-auth tests/aws-signing-test-suite/v4), the IAM `ListUsers`
/// example of "Create a signed AWS API request", and the signing keys of "Examples of how to
/// derive a signing key for Signature Version 4".
@Suite("AWS Signature Version 4", .timeLimit(.minutes(10)))
struct AWSSignatureV4Tests {
    static let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

    func signer(_ service: String) -> AWSSignatureV4 {
        AWSSignatureV4(accessKeyID: "AKIDEXAMPLE", secretAccessKey: Self.secret, region: "us-east-1", service: service)
    }

    @Test("get-vanilla: the canonical request, and the signature AWS publishes")
    func getVanilla() {
        let headers = [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")]
        let canonical = AWSSignatureV4.canonicalRequest(method: "GET", path: "/", query: [], headers: headers, payload: [])
        #expect(canonical.request == "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            signer("service").authorization(method: "GET", path: "/", query: [], headers: headers, payload: [], amzDate: "20150830T123600Z")
                == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")
    }

    @Test("post-vanilla: the signature AWS publishes")
    func postVanilla() {
        let headers = [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")]
        let auth = signer("service").authorization(method: "POST", path: "/", query: [], headers: headers, payload: [], amzDate: "20150830T123600Z")
        #expect(auth.hasSuffix("Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"))
    }

    @Test("IAM ListUsers: a query string and a content-type header signed, as AWS's guide shows")
    func iamListUsers() {
        let headers = [
            ("content-type", "application/x-www-form-urlencoded; charset=utf-8"), ("host", "iam.amazonaws.com"), ("x-amz-date", "20150830T123600Z"),
        ]
        let query = [("Version", "2010-05-08"), ("Action", "ListUsers")]
        let canonical = AWSSignatureV4.canonicalRequest(method: "GET", path: "/", query: query, headers: headers, payload: [])
        #expect(canonical.request.split(separator: "\n", omittingEmptySubsequences: false)[2] == "Action=ListUsers&Version=2010-05-08")
        let auth = signer("iam").authorization(method: "GET", path: "/", query: query, headers: headers, payload: [], amzDate: "20150830T123600Z")
        #expect(auth == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")
    }

    @Test("the signing keys AWS derives in its examples")
    func signingKeys() {
        func hex(_ key: SymmetricKey) -> String { key.withUnsafeBytes { AWSSignatureV4.hex(Array($0)) } }
        #expect(hex(signer("iam").signingKey(day: "20150830")) == "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9")
        #expect(hex(signer("iam").signingKey(day: "20120215")) == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d")
        #expect(hex(signer("service").signingKey(day: "20150830")) == "938127b5336810ddb6a5d6af445fcac9e371f9ed418ed386b022aed82901be75")
    }

    @Test("a path segment is encoded twice in the canonical request (every service but S3), and a session token is signed")
    func pathAndSessionToken() {
        let canonical = AWSSignatureV4.canonicalRequest(
            method: "DELETE", path: "/v2/email/suppression/addresses/a%40b.example", query: [], headers: [("host", "h")], payload: [])
        #expect(canonical.request.split(separator: "\n")[1] == "/v2/email/suppression/addresses/a%2540b.example")
        var withToken = signer("ses")
        withToken.sessionToken = "token/123"
        let added = withToken.signedHeaders(method: "GET", path: "/", headers: [("host", "h")], payload: [], date: Date(timeIntervalSince1970: 1_440_938_160))
        #expect(added.map(\.0) == ["x-amz-date", "x-amz-security-token", "authorization"])
        #expect(added[0].1 == "20150830T123600Z")
        #expect(added[2].1.contains("SignedHeaders=host;x-amz-date;x-amz-security-token,"))
    }
}
