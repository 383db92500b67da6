#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Logging
import Synchronization

/// The process's log handler: swift-log's `StreamLogHandler` line format
/// (`<time> <level> <label>: key=value … [source] message`, keys sorted), at a fraction of its
/// cost per line — which matters with one line per delivery:
/// - the timestamp is formatted once per second, not per line (`StreamLogHandler` calls
///   `localtime`, which on glibc stats /etc/localtime when TZ is unset, and `strftime` each time);
/// - the line is built in one string and written with one `write(2)`, without stdio's lock.
///
/// Still unbuffered: when `log` returns, the line is in the kernel, so a crash loses nothing
/// that was logged before it. One `write` per line keeps concurrent lines whole.
package struct LineLogHandler: LogHandler {
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level
    package var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let descriptor: Int32

    /// Writes to `descriptor` (standard error by default).
    package init(label: String, level: Logger.Level, descriptor: Int32 = 2, metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider) {
        self.label = label
        self.logLevel = level
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
        var line = Self.render(event: event, label: label, metadata: merged, timestamp: LogClock.shared.now())
        line.withUTF8 { bytes in Self.writeAll(bytes, to: descriptor) }
    }

    /// One line, newline included.
    static func render(event: LogEvent, label: String, metadata: Logger.Metadata, timestamp: String) -> String {
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
            line += value.description
        }
        line += " ["
        line += event.source
        line += "] "
        line += event.message.description
        line += "\n"
        return line
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
