import Logging
import Synchronization

/// Collects every log line (message and metadata, rendered) so a test can assert what was logged
/// — one line per delivery, and never an email address.
package final class LogCapture: Sendable {
    private let lines = Mutex<[String]>([])
    package init() {}

    package var all: [String] { lines.withLock { $0 } }
    package func append(_ line: String) { lines.withLock { $0.append(line) } }

    package func logger(_ label: String = "test") -> Logger {
        var logger = Logger(label: label, factory: { _ in Handler(capture: self) })
        logger.logLevel = .trace
        return logger
    }

    struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { $1 }
            let rendered = merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            capture.append("\(event.level) \(event.message) \(rendered)")
        }
    }
}
