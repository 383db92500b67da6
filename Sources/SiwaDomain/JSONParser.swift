import Foundation

/// A strict RFC 8259 parser into `JSONValue`, over UTF-8 bytes. Every delivery parses its body,
/// the JWS header, the claims and the `events` string; Foundation's JSONDecoder through a tolerant
/// `Codable` enum costs several times more. Bounded nesting (attacker-controlled input must not
/// exhaust the stack) and duplicate keys refused (one meaning per document).
struct JSONParser {
    static let maximumDepth = 64

    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0

    private init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    static func parse(_ data: some DataProtocol) -> JSONValue? {
        if let contiguous = data.withContiguousStorageIfAvailable({ parse(buffer: $0) }) { return contiguous }
        return Array(data).withUnsafeBufferPointer { parse(buffer: $0) }
    }

    private static func parse(buffer: UnsafeBufferPointer<UInt8>) -> JSONValue? {
        var parser = JSONParser(bytes: buffer)
        guard let value = parser.value(depth: 0) else { return nil }
        parser.skipWhitespace()
        return parser.index == buffer.count ? value : nil
    }

    private mutating func skipWhitespace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    private mutating func value(depth: Int) -> JSONValue? {
        guard depth <= Self.maximumDepth else { return nil }
        skipWhitespace()
        guard index < bytes.count else { return nil }
        switch bytes[index] {
        case UInt8(ascii: "{"): return object(depth: depth)
        case UInt8(ascii: "["): return array(depth: depth)
        case UInt8(ascii: "\""): return string().map(JSONValue.string)
        case UInt8(ascii: "t"): return literal("true", .bool(true))
        case UInt8(ascii: "f"): return literal("false", .bool(false))
        case UInt8(ascii: "n"): return literal("null", .null)
        default: return number()
        }
    }

    private mutating func literal(_ word: StaticString, _ result: JSONValue) -> JSONValue? {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { return nil }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] { return nil }
        index += count
        return result
    }

    private mutating func object(depth: Int) -> JSONValue? {
        index += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), let key = string() else { return nil }
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
            index += 1
            guard let member = value(depth: depth + 1), members.updateValue(member, forKey: key) == nil else { return nil }
            skipWhitespace()
            guard index < bytes.count else { return nil }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(members)
            } else {
                return nil
            }
        }
    }

    private mutating func array(depth: Int) -> JSONValue? {
        index += 1
        var elements: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            guard let element = value(depth: depth + 1) else { return nil }
            elements.append(element)
            skipWhitespace()
            guard index < bytes.count else { return nil }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(elements)
            } else {
                return nil
            }
        }
    }

    /// A string starting at the opening quote; validates UTF-8 and escapes.
    private mutating func string() -> String? {
        index += 1
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: bytes[start..<index])
                index += 1
                return String(validating: slice, as: UTF8.self)
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { return nil }
            index += 1
        }
        var scalars = Array(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                return String(validating: scalars, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard index < bytes.count else { return nil }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scalars.append(escape)
                case UInt8(ascii: "b"): scalars.append(0x08)
                case UInt8(ascii: "f"): scalars.append(0x0C)
                case UInt8(ascii: "n"): scalars.append(0x0A)
                case UInt8(ascii: "r"): scalars.append(0x0D)
                case UInt8(ascii: "t"): scalars.append(0x09)
                case UInt8(ascii: "u"):
                    guard var code = hex4() else { return nil }
                    if (0xD800...0xDBFF).contains(code) {
                        guard index + 2 <= bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else { return nil }
                        index += 2
                        guard let low = hex4(), (0xDC00...0xDFFF).contains(low) else { return nil }
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(code) {
                        return nil
                    }
                    guard let scalar = Unicode.Scalar(code) else { return nil }
                    scalars.append(contentsOf: Array(String(Character(scalar)).utf8))
                default:
                    return nil
                }
            default:
                if byte < 0x20 { return nil }
                scalars.append(byte)
            }
        }
        return nil
    }

    private mutating func hex4() -> UInt32? {
        guard index + 4 <= bytes.count else { return nil }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: return nil
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`; out-of-range values are refused.
    private mutating func number() -> JSONValue? {
        let start = index
        func digits() -> Int {
            let from = index
            while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") { index += 1 }
            return index - from
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { return nil }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if digits() == 0 {
            return nil
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { return nil }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { return nil }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard let value = Double(text), value.isFinite else { return nil }
        return .number(value)
    }
}
