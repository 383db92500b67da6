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
        var merged: Logger.Metadata
        let provided = metadataProvider?.get() ?? [:]
        if metadata.isEmpty && provided.isEmpty {
            merged = event.metadata ?? [:]  // the usual case: the call's metadata as it is, no copy
        } else {
            merged = metadata
            merged.merge(provided) { $1 }
            if let explicit = event.metadata { merged.merge(explicit) { $1 } }
        }
        if let error = event.error {
            merged["error.message"] = "\(error)"
            merged["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        switch format {
        case .text:
            var line: [UInt8] = []
            line.reserveCapacity(320)
            Self.render(event: event, label: label, metadata: merged, timestamp: LogClock.shared.now(), into: &line)
            line.withUnsafeBufferPointer { Self.writeAll($0, to: descriptor) }
        case .json:
            var line = Self.renderJSON(event: event, label: label, metadata: merged, timestamp: LogClock.shared.now())
            line.withUTF8 { Self.writeAll($0, to: descriptor) }
        }
    }

    /// One line, newline included.
    package static func render(event: LogEvent, label: String, metadata: Logger.Metadata, timestamp: String) -> String {
        var line: [UInt8] = []
        render(event: event, label: label, metadata: metadata, timestamp: timestamp, into: &line)
        return String(decoding: line, as: UTF8.self)
    }

    /// One line's UTF-8, newline included, appended to `line`: built as bytes, where plain ASCII
    /// (nearly every value) is copied whole and only other text is looked at scalar by scalar.
    package static func render(event: LogEvent, label: String, metadata: Logger.Metadata, timestamp: String, into line: inout [UInt8]) {
        line.append(contentsOf: timestamp.utf8)
        line.append(space)
        line.append(contentsOf: event.level.rawValue.utf8)
        if !label.isEmpty {
            line.append(space)
            line.append(contentsOf: label.utf8)
        }
        line.append(UInt8(ascii: ":"))
        // Keys sorted through the dictionary's indices: no (key, value) pair is copied to sort.
        var order = Array(metadata.indices)
        order.sort { metadata[$0].key < metadata[$1].key }
        for index in order {
            let (key, value) = metadata[index]
            line.append(space)
            line.append(contentsOf: key.utf8)
            line.append(UInt8(ascii: "="))
            appendValue(value.description, to: &line)
        }
        line.append(contentsOf: " [".utf8)
        line.append(contentsOf: event.source.utf8)
        line.append(contentsOf: "] ".utf8)
        appendEscaped(event.message.description, to: &line, quotes: false)
        line.append(UInt8(ascii: "\n"))
    }

    private static let space = UInt8(ascii: " ")

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
    package static func appendValue(_ value: String, to line: inout [UInt8]) {
        // Printable ASCII is settled by the byte (none of it is whitespace); only text with other
        // scalars asks Unicode's whitespace property, a table lookup that cost 3.6% of serve's CPU.
        var (plain, ascii) = value.utf8.withContiguousStorageIfAvailable(Self.plainASCII) ?? Self.plainASCII(Array(value.utf8))
        if plain && !ascii {
            plain = value.unicodeScalars.allSatisfy { scalar in
                switch scalar.value {
                case 0x21...0x7E: true
                case 0xA0...: !scalar.properties.isWhitespace
                default: false  // C1 controls
                }
            }
        }
        if plain {
            line.append(contentsOf: value.utf8)
        } else {
            line.append(UInt8(ascii: "\""))
            appendEscaped(value, to: &line, quotes: true)
            line.append(UInt8(ascii: "\""))
        }
    }

    /// Whether `bytes` could be a bare value (nothing that quotes or escapes), and whether they are
    /// all ASCII (if not, the other scalars still need Unicode's look).
    private static func plainASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> (plain: Bool, ascii: Bool) {
        var ascii = true
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "="), UInt8(ascii: "\""), UInt8(ascii: "\\"): return (false, ascii)
            case 0x21...0x7E: continue
            case 0x80...: ascii = false
            default: return (false, ascii)  // space, controls, DEL
            }
        }
        return (!bytes.isEmpty, ascii)
    }

    private static func plainASCII(_ bytes: [UInt8]) -> (plain: Bool, ascii: Bool) { bytes.withUnsafeBufferPointer(plainASCII) }

    /// `appendEscaped(_:to:quotes:)` into bytes: printable ASCII with nothing to escape is copied whole.
    package static func appendEscaped(_ text: String, to line: inout [UInt8], quotes: Bool) {
        let verbatim = text.utf8.allSatisfy { byte in
            (0x20...0x7E).contains(byte) && !(quotes && (byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")))
        }
        if verbatim {
            line.append(contentsOf: text.utf8)
        } else {
            var escaped = ""
            appendEscaped(text, to: &escaped, quotes: quotes)
            line.append(contentsOf: escaped.utf8)
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
