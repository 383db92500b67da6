import Foundation

/// base64url without padding (RFC 7515 §2), as JWS segments use it.
package enum Base64URL {
    /// Decodes a base64url segment; nil when it holds characters outside the alphabet.
    package static func decode(_ text: some StringProtocol) -> Data? {
        var base64 = String(text)
        guard base64.utf8.allSatisfy({ byte in
            (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39)
                || byte == 0x2D || byte == 0x5F
        }) else { return nil }
        base64 = base64.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        let remainder = base64.utf8.count % 4
        if remainder == 1 { return nil }
        if remainder > 0 { base64 += String(repeating: "=", count: 4 - remainder) }
        guard let data = Data(base64Encoded: base64) else { return nil }
        // Canonical only: unused trailing bits must be zero, so each token has one spelling
        // ("QR" and "QQ" would otherwise decode to the same byte).
        guard encode(data) == text else { return nil }
        return data
    }

    package static func encode(_ data: some DataProtocol) -> String {
        Data(data).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
