import Foundation

/// A compact JWS split into its parts, with its header read. Parsing checks only the shape
/// (three base64url segments, a JSON object header); it decides nothing about trust.
package struct CompactJWS: Sendable {
    package let raw: String
    package let header: JSONValue
    package let headerJSON: String
    /// The base64url payload segment as received (its SHA-256 is the id of a token without `jti`).
    package let payloadSegment: Substring
    package let payload: Data
    package let signature: Data
    /// `BASE64URL(header) "." BASE64URL(payload)`: the bytes the signature covers.
    package var signingInput: Substring { raw[raw.startIndex..<signingInputEnd] }
    private let signingInputEnd: String.Index

    private static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 }

    package var algorithm: String? { header["alg"]?.stringValue }
    package var kid: String? { header["kid"]?.stringValue }

    package init(_ text: String) throws(VerificationError) {
        let raw = text.utf8.first.map(Self.isSpace) == true || text.utf8.last.map(Self.isSpace) == true
            ? text.trimmingCharacters(in: .whitespacesAndNewlines) : text
        let parts = Self.segments(raw)
        guard parts.count == 3 else {
            throw .malformed("payload is not a compact JWS: expected three base64url segments separated by dots, found \(parts.count)")
        }
        guard let headerData = Base64URL.decode(parts[0]), let payload = Base64URL.decode(parts[1]),
            let signature = Base64URL.decode(parts[2])
        else {
            throw .malformed("payload is not a compact JWS: a segment is not valid base64url")
        }
        guard let header = JSONValue.parse(headerData), header.objectValue != nil else {
            throw .malformed("the JWS header is not a JSON object")
        }
        self.raw = raw
        self.header = header
        self.headerJSON = String(decoding: headerData, as: UTF8.self)
        self.payloadSegment = parts[1]
        self.payload = payload
        self.signature = signature
        self.signingInputEnd = parts[1].endIndex
    }

    /// `text` split at its dots, up to four segments (empty ones kept): `memchr` over its UTF-8
    /// bytes, 20 times cheaper than `split` on the UTF-8 view (BENCHMARKS.md).
    package static func segments(_ text: String) -> [Substring] {
        func dots(_ bytes: UnsafeBufferPointer<UInt8>) -> [Int] {
            var dots: [Int] = []
            guard let base = bytes.baseAddress else { return dots }
            var offset = 0
            while dots.count < 3, offset < bytes.count, let dot = memchr(base + offset, Int32(UInt8(ascii: ".")), bytes.count - offset) {
                offset = base.distance(to: dot.assumingMemoryBound(to: UInt8.self))
                dots.append(offset)
                offset += 1
            }
            return dots
        }
        let dots = text.utf8.withContiguousStorageIfAvailable(dots) ?? Array(text.utf8).withUnsafeBufferPointer(dots)
        let utf8 = text.utf8
        var segments: [Substring] = []
        var start = utf8.startIndex
        for dot in dots {
            let end = utf8.index(utf8.startIndex, offsetBy: dot)
            segments.append(text[start..<end])
            start = utf8.index(after: end)
        }
        segments.append(text[start...])
        return segments
    }
}

extension CompactJWS {
    /// Checks the header: RS256 only, whatever else the header claims (`none`, `HS256`, … are refused
    /// before any key is looked at), and a `kid` to resolve. Returns the `kid`. Here rather than in
    /// `NotificationVerifier` so that the parsing of unauthenticated input needs Foundation only
    /// (`scripts/fuzz` compiles it alone).
    package func checkHeader() throws(VerificationError) -> String {
        guard let alg = algorithm else {
            throw .invalid(.unsupportedAlgorithm, "the JWS header has no alg; only RS256 is accepted")
        }
        guard alg == "RS256" else {
            throw .invalid(.unsupportedAlgorithm, "alg \(alg) is not accepted; Apple signs with RS256")
        }
        // RFC 7515 §4.1.11: a recipient that does not understand a `crit` extension must refuse
        // the token. We understand none, and Apple sends none.
        if header["crit"] != nil {
            throw .invalid(.unsupportedHeader, "the JWS header has crit (extensions that must be understood); none is supported here, and Apple sends none")
        }
        guard let kid, !kid.isEmpty else {
            throw .invalid(.unknownKey, "the JWS header has no kid; cannot pick an Apple key")
        }
        return kid
    }
}
