import Foundation

/// A JSON document as a value. Apple's claims are loosely typed in practice (`events` is a string
/// holding JSON, `is_private_email` a string or a boolean, `event_time` seconds or milliseconds), so
/// decoding goes through this tolerant value and the rules pick fields out of it explicitly.
package enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses `data` as JSON (strict RFC 8259, nesting bounded, duplicate keys refused); nil when
    /// it is not JSON.
    package static func parse(_ data: some DataProtocol) -> JSONValue? {
        JSONParser.parse(data)
    }

    package subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    package var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    package var numberValue: Double? {
        if case .number(let value) = self { return value }
        return nil
    }

    package var arrayValue: [JSONValue]? {
        if case .array(let value) = self { return value }
        return nil
    }

    package var objectValue: [String: JSONValue]? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// Compact JSON text of this value (keys sorted, so equal values give equal text; `/` unescaped).
    /// Keys are sorted by their UTF-8 bytes: String's `<` is not a strict weak order once strings
    /// are not in NFC (`"é"` spelled `e` + U+0301 is neither below nor above `"éI"`), which made
    /// the order, and so the text, follow the dictionary's hash-seeded layout.
    package var jsonText: String {
        var output: [UInt8] = []
        output.reserveCapacity(128)
        write(into: &output)
        return String(decoding: output, as: UTF8.self)
    }

    private func write(into output: inout [UInt8]) {
        switch self {
        case .null: output.append(contentsOf: "null".utf8)
        case .bool(let value): output.append(contentsOf: (value ? "true" : "false").utf8)
        case .number(let value):
            if value.rounded() == value, abs(value) < 9e15 {
                output.append(contentsOf: String(Int64(value)).utf8)
            } else {
                output.append(contentsOf: "\(value)".utf8)
            }
        case .string(let value): Self.write(string: value, into: &output)
        case .array(let values):
            output.append(UInt8(ascii: "["))
            for (index, value) in values.enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                value.write(into: &output)
            }
            output.append(UInt8(ascii: "]"))
        case .object(let members):
            output.append(UInt8(ascii: "{"))
            for (index, key) in members.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }).enumerated() {
                if index > 0 { output.append(UInt8(ascii: ",")) }
                Self.write(string: key, into: &output)
                output.append(UInt8(ascii: ":"))
                members[key]!.write(into: &output)
            }
            output.append(UInt8(ascii: "}"))
        }
    }

    private static func write(string: String, into output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "\""): output.append(contentsOf: "\\\"".utf8)
            case UInt8(ascii: "\\"): output.append(contentsOf: "\\\\".utf8)
            case 0x0A: output.append(contentsOf: "\\n".utf8)
            case 0x0D: output.append(contentsOf: "\\r".utf8)
            case 0x09: output.append(contentsOf: "\\t".utf8)
            case 0..<0x20:
                let hex = String(byte, radix: 16)
                output.append(contentsOf: ("\\u" + String(repeating: "0", count: 4 - hex.count) + hex).utf8)
            default: output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }
}

/// Literals, for building documents in code: `["aud": "com.example.app", "sub": .string(sub)]`.
extension JSONValue: ExpressibleByStringLiteral, ExpressibleByDictionaryLiteral {
    package init(stringLiteral value: String) { self = .string(value) }

    package init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { $1 }))
    }
}
