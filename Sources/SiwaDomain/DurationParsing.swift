import Foundation

/// One duration syntax for every setting and flag: an integer and a unit, `30s`, `5m`, `2h`, `400d`
/// (also `ms`). Kept strict on purpose: `5` or `1h30m` is rejected with a message showing the form.
package enum DurationSyntax {
    package struct ParseError: Error, CustomStringConvertible {
        package let input: String
        package var description: String {
            "\"\(input)\" is not a duration: use a whole number and a unit, e.g. 500ms, 30s, 5m, 2h, 400d"
        }
    }

    package static func parse(_ text: String) throws(ParseError) -> Duration {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let digits = trimmed.prefix(while: \.isNumber)
        let unit = trimmed.dropFirst(digits.count)
        guard !digits.isEmpty, let value = Int64(digits) else { throw ParseError(input: text) }
        switch unit {
        case "ms": return .milliseconds(value)
        case "s": return .seconds(value)
        case "m": return .seconds(value * 60)
        case "h": return .seconds(value * 3600)
        case "d": return .seconds(value * 86_400)
        default: throw ParseError(input: text)
        }
    }

    /// The shortest exact rendering in the same syntax (`90s` → `90s`, `3600s` → `1h`).
    package static func format(_ duration: Duration) -> String {
        let millis = duration.milliseconds
        if millis % 1000 != 0 { return "\(millis)ms" }
        let seconds = millis / 1000
        for (unit, size) in [("d", Int64(86_400)), ("h", 3600), ("m", 60)] where seconds != 0 && seconds % size == 0 {
            return "\(seconds / size)\(unit)"
        }
        return "\(seconds)s"
    }
}


extension Duration {
    /// Whole milliseconds (truncated).
    package var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }

    package var timeInterval: TimeInterval {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
