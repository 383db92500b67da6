/// `application/x-www-form-urlencoded` bodies, as Apple's auth endpoints take them. Encoding
/// leaves only RFC 3986's unreserved characters as they are, so `+`, `/`, `=`, `&` in a token
/// arrive intact.
package enum FormURLEncoding {
    package static func encode(_ fields: [(name: String, value: String)]) -> String {
        fields.map { escape($0.name) + "=" + escape($0.value) }.joined(separator: "&")
    }

    /// The fields of a body, in order (`+` is a space); nil when an escape is malformed or not UTF-8.
    package static func decode(_ body: String) -> [(name: String, value: String)]? {
        var fields: [(name: String, value: String)] = []
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = unescape(parts[0]), let value = unescape(parts.count > 1 ? parts[1] : "") else { return nil }
            fields.append((name, value))
        }
        return fields
    }

    private static let hex = Array("0123456789ABCDEF".utf8)

    private static func escape(_ text: String) -> String {
        var output: [UInt8] = []
        output.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                output.append(byte)
            default:
                output.append(contentsOf: [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]])
            }
        }
        return String(decoding: output, as: UTF8.self)
    }

    private static func unescape(_ text: Substring) -> String? {
        var output: [UInt8] = []
        var bytes = text.utf8.makeIterator()
        while let byte = bytes.next() {
            switch byte {
            case UInt8(ascii: "+"): output.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = bytes.next().flatMap(hexValue), let low = bytes.next().flatMap(hexValue) else { return nil }
                output.append(high << 4 | low)
            default: output.append(byte)
            }
        }
        return String(validating: output, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
