import Crypto
import Foundation

/// AWS Signature Version 4 (header form), written from AWS's specification on swift-crypto's
/// SHA-256 and HMAC ("Create a signed AWS API request"), and held to AWS's published test vectors
/// (`AWSSignatureV4Tests`). The Swift AWS SDK is not among our packages; SES is one PUT and
/// one DELETE.
package struct AWSSignatureV4: Sendable {
    package var accessKeyID: String
    package var secretAccessKey: String
    /// Temporary credentials' token (`AWS_SESSION_TOKEN`), sent as `x-amz-security-token`.
    package var sessionToken: String?
    package var region: String
    package var service: String

    package init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil, region: String, service: String) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
        self.region = region
        self.service = service
    }

    /// `20150830T123600Z`, the `x-amz-date` of `date`.
    package static func amzDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        return formatter.string(from: date)
    }

    /// The headers to add to a request sent at `date` (`x-amz-date`, the session token if any,
    /// `authorization`), signing `headers` (which must hold `host`) and those added.
    package func signedHeaders(
        method: String, path: String, query: [(String, String)] = [], headers: [(String, String)], payload: [UInt8], date: Date
    ) -> [(String, String)] {
        let amzDate = Self.amzDate(date)
        var added = [("x-amz-date", amzDate)]
        if let sessionToken { added.append(("x-amz-security-token", sessionToken)) }
        let auth = authorization(method: method, path: path, query: query, headers: headers + added, payload: payload, amzDate: amzDate)
        return added + [("authorization", auth)]
    }

    /// The `Authorization` header's value for a request whose headers (with `x-amz-date`) are all signed.
    package func authorization(method: String, path: String, query: [(String, String)], headers: [(String, String)], payload: [UInt8], amzDate: String) -> String {
        let canonical = Self.canonicalRequest(method: method, path: path, query: query, headers: headers, payload: payload)
        let day = String(amzDate.prefix(8))
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let toSign = "AWS4-HMAC-SHA256\n\(amzDate)\n\(scope)\n\(Self.hex(SHA256.hash(data: Array(canonical.request.utf8))))"
        let signature = HMAC<SHA256>.authenticationCode(for: Array(toSign.utf8), using: signingKey(day: day))
        return "AWS4-HMAC-SHA256 Credential=\(accessKeyID)/\(scope), SignedHeaders=\(canonical.signedHeaders), Signature=\(Self.hex(signature))"
    }

    /// The key of `day` (`yyyyMMdd`): HMAC chained over the date, region, service and `aws4_request`.
    package func signingKey(day: String) -> SymmetricKey {
        var key = SymmetricKey(data: Array("AWS4\(secretAccessKey)".utf8))
        for part in [day, region, service, "aws4_request"] {
            key = SymmetricKey(data: Data(HMAC<SHA256>.authenticationCode(for: Array(part.utf8), using: key)))
        }
        return key
    }

    /// The canonical request and its signed-header list. The path's segments are URI-encoded
    /// once more (AWS services other than S3 sign the encoded path encoded again).
    package static func canonicalRequest(
        method: String, path: String, query: [(String, String)], headers: [(String, String)], payload: [UInt8]
    ) -> (request: String, signedHeaders: String) {
        let uri = path.isEmpty ? "/" : path.split(separator: "/", omittingEmptySubsequences: false).map { encode(String($0)) }.joined(separator: "/")
        let canonicalQuery = query.map { (encode($0.0), encode($0.1)) }.sorted { ($0.0, $0.1) < ($1.0, $1.1) }.map { "\($0.0)=\($0.1)" }
            .joined(separator: "&")
        var byName: [String: [String]] = [:]
        for (name, value) in headers {
            let trimmed = value.trimmingCharacters(in: .whitespaces).split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
            byName[name.lowercased(), default: []].append(trimmed)
        }
        let names = byName.keys.sorted()
        let canonicalHeaders = names.map { "\($0):\(byName[$0]!.joined(separator: ","))\n" }.joined()
        let signed = names.joined(separator: ";")
        let request = [method, uri, canonicalQuery, canonicalHeaders, signed, hex(SHA256.hash(data: payload))].joined(separator: "\n")
        return (request, signed)
    }

    /// RFC 3986 encoding as AWS asks: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX` (upper case).
    package static func encode(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }

    package static func hex<D: Sequence>(_ digest: D) -> String where D.Element == UInt8 {
        digest.map { String(format: "%02x", $0) }.joined()
    }
}
