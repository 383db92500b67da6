import Foundation

/// A JSON document as a value. Apple's claims are loosely typed in practice (`events` is a string
/// holding JSON, `is_private_email` a string or a boolean, `event_time` seconds or milliseconds), so
/// decoding goes through this tolerant value and the rules pick fields out of it explicitly.
package enum JSONValue: Sendable, Equatable, Codable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value):
            if value.rounded() == value, abs(value) < 9e15 {
                try container.encode(Int64(value))
            } else {
                try container.encode(value)
            }
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Parses `data` as JSON; nil when it is not JSON.
    package static func parse(_ data: some DataProtocol) -> JSONValue? {
        try? JSONDecoder().decode(JSONValue.self, from: Data(data))
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

    package var objectValue: [String: JSONValue]? {
        if case .object(let value) = self { return value }
        return nil
    }

    /// Compact JSON text of this value (keys sorted, so equal values give equal text).
    package var jsonText: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data("null".utf8), as: UTF8.self)
    }
}
