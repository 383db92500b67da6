#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Logging
import SiwaDomain
import Synchronization

/// How log lines are written (`SIWA_LOG_FORMAT`).
package enum LogFormat: String, Sendable, CaseIterable {
    /// `<time> <level> <label>: key=value … [source] message`: swift-log's `StreamLogHandler` line,
    /// with logfmt quoting of values.
    case text
    /// One JSON object per line, for log shippers.
    case json
}

/// The process's log handler: swift-log's `StreamLogHandler` line format (keys sorted) or one JSON
/// object a line, cheaper per line (timestamp formatted once a second, one `write(2)` a line,
/// unbuffered so a crash loses nothing logged). Values come from unverified requests, so none can
/// forge a line or a key: logfmt quoting and escaping of values and the message's control characters.
package struct LineLogHandler: LogHandler {
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level
    package var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let descriptor: Int32
    private let format: LogFormat

    /// Writes to `descriptor` (standard error by default).
    package init(
        label: String, level: Logger.Level, format: LogFormat = .text, descriptor: Int32 = 2,
        metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider
    ) {
        self.label = label
        self.logLevel = level
        self.format = format
        self.descriptor = descriptor
        self.metadataProvider = metadataProvider
    }

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    package func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty {
            merged.merge(provided) { $1 }
        }
        if let explicit = event.metadata, !explicit.isEmpty {
            merged.merge(explicit) { $1 }
        }
        if let error = event.error {
            merged["error.message"] = "\(error)"
            merged["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        var line =
            switch format {
            case .text: Self.render(event: event, label: label, metadata: merged, timestamp: LogClock.shared.now())
            case .json: Self.renderJSON(event: event, label: label, metadata: merged, timestamp: LogClock.shared.now())
            }
        line.withUTF8 { bytes in Self.writeAll(bytes, to: descriptor) }
    }

    /// One line, newline included.
    package static func render(event: LogEvent, label: String, metadata: Logger.Metadata, timestamp: String) -> String {
        var line = ""
        line.reserveCapacity(256)
        line += timestamp
        line += " "
        line += event.level.rawValue
        if !label.isEmpty {
            line += " "
            line += label
        }
        line += ":"
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
            line += " "
            line += key
            line += "="
            appendValue(value.description, to: &line)
        }
        line += " ["
        line += event.source
        line += "] "
        appendEscaped(event.message.description, to: &line, quotes: false)
        line += "\n"
        return line
    }

    /// One JSON object, newline included: `time`, `level`, `label`, `source`, `message`, then the
    /// metadata's keys (nested values as JSON arrays and objects).
    package static func renderJSON(event: LogEvent, label: String, metadata: Logger.Metadata, timestamp: String) -> String {
        func json(_ value: Logger.Metadata.Value) -> JSONValue {
            switch value {
            case .string(let text): .string(text)
            case .stringConvertible(let convertible): .string(convertible.description)
            case .array(let values): .array(values.map(json))
            case .dictionary(let values): .object(values.mapValues(json))
            }
        }
        var object: [String: JSONValue] = metadata.mapValues(json)
        object["time"] = .string(timestamp)
        object["level"] = .string(event.level.rawValue)
        object["label"] = .string(label)
        object["source"] = .string(event.source)
        object["message"] = .string(event.message.description)
        return JSONValue.object(object).jsonText + "\n"
    }

    /// A logfmt value: bare when it is a plain word, quoted and escaped otherwise (an empty value
    /// is `""`), so it can neither end the line nor start another key.
    package static func appendValue(_ value: String, to line: inout String) {
        // Printable ASCII is settled by the byte (none of it is whitespace); only other scalars
        // ask Unicode's whitespace property, a table lookup that cost 3.6% of serve's CPU.
        let plain = !value.isEmpty && value.unicodeScalars.allSatisfy { scalar in
            switch scalar.value {
            case 0x21...0x7E: scalar != "=" && scalar != "\"" && scalar != "\\"
            case 0xA0...: !scalar.properties.isWhitespace
            default: false  // space, controls, DEL, C1 controls
            }
        }
        if plain {
            line += value
        } else {
            line += "\""
            appendEscaped(value, to: &line, quotes: true)
            line += "\""
        }
    }

    /// `text` with control characters escaped (`\n`, `\r`, `\t`, `\u{1b}`, …); with `quotes`, also
    /// `"` and `\` (inside a quoted value).
    package static func appendEscaped(_ text: String, to line: inout String, quotes: Bool) {
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": line += "\\n"
            case "\r": line += "\\r"
            case "\t": line += "\\t"
            case "\"" where quotes: line += "\\\""
            case "\\" where quotes: line += "\\\\"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F || (0x80...0x9F).contains(scalar.value)
                    || scalar == "\u{2028}" || scalar == "\u{2029}" || scalar == "\u{85}"
                {
                    line += "\\u{" + String(scalar.value, radix: 16) + "}"
                } else {
                    line.unicodeScalars.append(scalar)
                }
            }
        }
    }

    private static func writeAll(_ bytes: UnsafeBufferPointer<UInt8>, to descriptor: Int32) {
        guard var next = bytes.baseAddress else { return }
        var left = bytes.count
        while left > 0 {
            let written = write(descriptor, next, left)
            if written > 0 {
                next += written
                left -= written
            } else if written < 0 && errno == EINTR {
                continue
            } else {
                return  // like StreamLogHandler: a log line that cannot be written is dropped
            }
        }
    }
}

/// `2026-11-22T05:17:40+0000` (local time, as `StreamLogHandler` prints it), formatted once per second.
final class LogClock: Sendable {
    static let shared = LogClock()
    private let cached = Mutex<(second: Int, text: String)>((-1, ""))

    func now() -> String {
        var seconds = time(nil)
        if let hit = cached.withLock({ $0.second == seconds ? $0.text : nil }) { return hit }
        var parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let length = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        let text = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        cached.withLock { $0 = (seconds, text) }
        return text
    }
}
