import Foundation
import Logging
import SiwaApp
import SiwaRuntime
import Synchronization
import Testing

/// The process's log lines: what on-call engineers grep and log shippers parse.
@Suite(.timeLimit(.minutes(10))) struct LineLogHandlerTests {
    /// A file the handler appends to, read back whole.
    final class LogFile {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-log-\(UUID().uuidString)").path
        let descriptor: Int32
        init() { descriptor = open(path, O_WRONLY | O_CREAT | O_APPEND, 0o600) }
        deinit {
            close(descriptor)
            unlink(path)
        }
        var lines: [Substring] {
            let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            return text.split(separator: "\n", omittingEmptySubsequences: false)
        }
    }

    /// StreamLogHandler's output, captured.
    final class Buffer: Sendable {
        let text = Mutex("")
    }
    struct Captured: TextOutputStream, Sendable {
        let buffer = Buffer()
        mutating func write(_ string: String) { buffer.text.withLock { $0 += string } }
    }

    struct Refused: Error, CustomStringConvertible {
        var description: String { "the database refused the batch" }
    }

    @Test func linesAreStreamLogHandlersLines() throws {
        let file = LogFile()
        var ours = Logger(label: "siwa-events") { LineLogHandler(label: $0, level: .info, descriptor: file.descriptor, metadataProvider: nil) }
        let captured = Captured()
        var theirs = Logger(label: "siwa-events") { StreamLogHandler(label: $0, stream: captured, metadataProvider: nil) }
        ours[metadataKey: "worker"] = "2"
        theirs[metadataKey: "worker"] = "2"
        let metadata: Logger.Metadata = ["outcome": "accepted", "jti": "abc", "latency_ms": "1.5"]
        ours.info("delivery", metadata: metadata)
        theirs.info("delivery", metadata: metadata)
        ours.debug("not at this level")
        theirs.debug("not at this level")
        ours.warning("plain")
        theirs.warning("plain")
        ours.error("batch refused", error: Refused(), metadata: ["size": "3"])
        theirs.error("batch refused", error: Refused(), metadata: ["size": "3"])

        let written = file.lines
        let expected = captured.buffer.text.withLock { $0 }.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(written.count == 4)  // three lines and the final newline
        #expect(written.last == "")
        // Same text after the timestamp (both print the local time to the second) while no value
        // needs quoting; one that does is quoted (LogSafetyTests), where StreamLogHandler writes it raw.
        #expect(written.prefix(2).map { $0.drop { $0 != " " } } == expected.prefix(2).map { $0.drop { $0 != " " } })
        #expect(written[0].hasSuffix(" info siwa-events: jti=abc latency_ms=1.5 outcome=accepted worker=2 [SiwaAppTests] delivery"))
        let timestamp = String(written[0].prefix { $0 != " " })
        #expect(timestamp.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}/) != nil, "timestamp \(timestamp)")
        #expect(written[2].contains(#"error.message="the database refused the batch""#))
        #expect(expected[2].contains("error.message=the database refused the batch"))
    }

    @Test func concurrentLinesStayWhole() async throws {
        let file = LogFile()
        let logger = Logger(label: "siwa-events") { LineLogHandler(label: $0, level: .info, descriptor: file.descriptor, metadataProvider: nil) }
        let padding = String(repeating: "x", count: 300)
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<8 {
                group.addTask {
                    for line in 0..<250 { logger.info("line", metadata: ["task": "\(task)", "n": "\(line)", "pad": "\(padding)"]) }
                }
            }
        }
        let lines = file.lines.dropLast()
        #expect(lines.count == 2_000)
        var seen = Set<String>()
        for line in lines {
            let match = line.firstMatch(of: /: n=(\d+) pad=x{300} task=(\d) \[SiwaAppTests\] line$/)
            #expect(match != nil, "torn or malformed line: \(line.prefix(120))")
            if let match { seen.insert("\(match.2)/\(match.1)") }
        }
        #expect(seen.count == 2_000)
    }
}
