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
}
