import Foundation

/// base64url without padding (RFC 7515 §2), as JWS segments use it. Byte-level and strict: only
/// the URL-safe alphabet, no padding, and unused trailing bits must be zero, so each token has
/// exactly one spelling ("QR" and "QQ" would otherwise decode to the same byte). On the hot path
/// of every delivery, so no string rewriting (Foundation's base64 needs `+/=` spelled back in).
package enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, byte) in alphabet.enumerated() { table[Int(byte)] = UInt8(index) }
        return table
    }()

    /// Decodes a base64url segment; nil when it is not canonical unpadded base64url.
    package static func decode(_ text: some StringProtocol) -> Data? {
        if let result = text.utf8.withContiguousStorageIfAvailable({ decode(bytes: $0) }) { return result }
        return Array(text.utf8).withUnsafeBufferPointer { decode(bytes: $0) }
    }

    private static func decode(bytes: UnsafeBufferPointer<UInt8>) -> Data? {
        let remainder = bytes.count % 4
        guard remainder != 1 else { return nil }
        var output = [UInt8]()
        output.reserveCapacity(bytes.count / 4 * 3 + 2)
        var index = 0
        let decoded = values.withUnsafeBufferPointer { table -> [UInt8]? in
            while index + 4 <= bytes.count {
                let a = table[Int(bytes[index])], b = table[Int(bytes[index + 1])]
                let c = table[Int(bytes[index + 2])], d = table[Int(bytes[index + 3])]
                guard a < 64, b < 64, c < 64, d < 64 else { return nil }
                output.append(a << 2 | b >> 4)
                output.append(b << 4 | c >> 2)
                output.append(c << 6 | d)
                index += 4
            }
            switch remainder {
            case 2:
                let a = table[Int(bytes[index])], b = table[Int(bytes[index + 1])]
                guard a < 64, b < 64, b & 0x0F == 0 else { return nil }
                output.append(a << 2 | b >> 4)
            case 3:
                let a = table[Int(bytes[index])], b = table[Int(bytes[index + 1])], c = table[Int(bytes[index + 2])]
                guard a < 64, b < 64, c < 64, c & 0x03 == 0 else { return nil }
                output.append(a << 2 | b >> 4)
                output.append(b << 4 | c >> 2)
            default:
                break
            }
            return output
        }
        return decoded.map { Data($0) }
    }

    package static func encode(_ data: some DataProtocol) -> String {
        let bytes = Array(data)
        var output = [UInt8]()
        output.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let (a, b, c) = (bytes[index], bytes[index + 1], bytes[index + 2])
            output.append(alphabet[Int(a >> 2)])
            output.append(alphabet[Int((a & 0x03) << 4 | b >> 4)])
            output.append(alphabet[Int((b & 0x0F) << 2 | c >> 6)])
            output.append(alphabet[Int(c & 0x3F)])
            index += 3
        }
        switch bytes.count - index {
        case 1:
            let a = bytes[index]
            output.append(alphabet[Int(a >> 2)])
            output.append(alphabet[Int((a & 0x03) << 4)])
        case 2:
            let (a, b) = (bytes[index], bytes[index + 1])
            output.append(alphabet[Int(a >> 2)])
            output.append(alphabet[Int((a & 0x03) << 4 | b >> 4)])
            output.append(alphabet[Int((b & 0x0F) << 2)])
        default:
            break
        }
        return String(decoding: output, as: UTF8.self)
    }
}
