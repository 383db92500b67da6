import Foundation
import SiwaEmbeddedPostgres
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child process's stdout and stderr, read from a pipe as they come: a test awaits the line it
/// expects (each read is an event) instead of polling a log file.
package final class ChildOutput: Sendable {
    private let state = Mutex("")
    /// One per read; closed at end of output (the child exited).
    private let reads = Progress()
    private let ended = Mutex(false)

    /// Everything the child has written so far.
    package var text: String { state.withLock { $0 } }

    /// Starts `executable` with its output read here.
    package static func start(
        _ executable: String, _ arguments: [String], environment: [String: String], workingDirectory: String
    ) throws -> (ChildProcess, ChildOutput) {
        var ends: [Int32] = [0, 0]
        // Children spawned by `ChildProcess` inherit no descriptor but 0-2 (it closes the rest).
        guard pipe(&ends) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(ends[1]) }  // the child holds its own copy: end of output is the child's exit
        let child: ChildProcess
        do {
            child = try Subprocess.start(executable, arguments, environment: environment, workingDirectory: workingDirectory, output: ends[1])
        } catch {
            close(ends[0])
            throw error
        }
        return (child, ChildOutput(reading: ends[0]))
    }

    /// What is written to `file` from byte `offset` on, as it comes (`tail -F`, which inotify
    /// wakes): a PostgreSQL server log awaited like a child's output. Signal the tail when done.
    package static func following(_ file: String, from offset: UInt64) throws -> (ChildProcess, ChildOutput) {
        try start("/usr/bin/tail", ["-c", "+\(offset + 1)", "-F", file], environment: ProcessInfo.processInfo.environment, workingDirectory: "/")
    }

    private init(reading descriptor: Int32) {
        Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = read(descriptor, &buffer, buffer.count)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { break }
                self.state.withLock { $0 += String(decoding: buffer[..<count], as: UTF8.self) }
                self.reads.add()
            }
            close(descriptor)
            self.ended.withLock { $0 = true }
            self.reads.close()
        }.start()
    }

    /// Whether the output comes to contain `needle` within `limit`: false at its end or the limit.
    package func wait(for needle: String, within limit: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while true {
            let seen = reads.value
            if text.contains(needle) { return true }
            guard await reads.wait(until: seen + 1, within: deadline - .now) else { return text.contains(needle) }
        }
    }

    /// Whether the output comes to contain one of `needles` within `limit`.
    package func wait(forAnyOf needles: [String], within limit: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while true {
            let seen = reads.value
            if needles.contains(where: text.contains) { return true }
            guard await reads.wait(until: seen + 1, within: deadline - .now) else { return needles.contains(where: text.contains) }
        }
    }

    /// The port in the `address` of the first complete line that contains `message` (text or JSON
    /// log format: `address=HOST:PORT`, `"address":"HOST:PORT"`), once one is written within `limit`.
    package func port(loggedWith message: String, within limit: Duration = .seconds(60)) async -> Int? {
        guard await wait(for: message, within: limit) else { return nil }
        // The rest of the line may still be on its way: wait for its end.
        let deadline = ContinuousClock.now + limit
        while true {
            let seen = reads.value
            if let line = text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().first(where: { $0.contains(message) }) {
                guard let key = line.range(of: "address") else { return nil }
                let value = line[key.upperBound...].drop { $0 == "=" || $0 == "\"" || $0 == ":" }.prefix { !$0.isWhitespace && $0 != "\"" && $0 != "," }
                return value.split(separator: ":").last.flatMap { Int($0) }
            }
            guard await reads.wait(until: seen + 1, within: deadline - .now) else { return nil }
        }
    }

    /// Whether the output comes to hold a complete line containing every one of `parts` within
    /// `limit` (one log line's message and metadata, say: `["] job", "jti=a", "outcome=applied"]`).
    package func wait(forLineWith parts: [String], count: Int = 1, within limit: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        func found() -> Bool {
            text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().count { line in parts.allSatisfy { line.contains($0) } } >= count
        }
        while true {
            let seen = reads.value
            if found() { return true }
            guard await reads.wait(until: seen + 1, within: deadline - .now) else { return found() }
        }
    }

    /// Whether the output ends (every writer closed it: the child exited, and any process it
    /// left holding the pipe too) within `limit`; `text` is then all there will be.
    package func waitForEnd(within limit: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + limit
        while !ended.withLock({ $0 }) {
            guard await reads.wait(until: reads.value + 1, within: deadline - .now) else { return ended.withLock { $0 } }
        }
        return true
    }
}
