import ArgumentParser
import Foundation
import Logging
import SiwaRuntime

/// The cost of one log line as `serve` writes it: the call site's metadata built, the line
/// formatted by `LineLogHandler` and handed to its file descriptor. The two lines every accepted
/// notification writes at `info`, the receiver's `delivery` (7 fields) and the worker's `job` (10),
/// alternate; the process's CPU per line (every thread, the writer's included) and the caller's
/// wall time per line are reported.
struct LogLines: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log-lines", abstract: "Format and hand off serve's two info lines; CPU and wall time per line.")
    @Option(help: "Lines to write per thread.") var lines = 400_000
    @Option(help: "Threads writing at once.") var threads = 1
    @Option(help: "text or json.") var format = "text"
    @Option(help: "File the lines go to (appended).") var output = "/dev/null"

    func run() async throws {
        guard let format = LogFormat(rawValue: format) else { throw ValidationError("--format: expected text or json, got '\(format)'") }
        let descriptor = open(output, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        guard descriptor >= 0 else { throw ValidationError("--output: cannot open \(output)") }
        defer { close(descriptor) }
        let logger = Logger(label: "siwa-events") { LineLogHandler(label: $0, level: .info, format: format, descriptor: descriptor, metadataProvider: nil) }
        let perThread = lines
        let cpu0 = Self.processCPU()
        let clock = ContinuousClock()
        let started = clock.now
        let workers = (0..<threads).map { thread in
            Thread {
                for index in 0..<perThread / 2 { Self.writeLinePair(logger, thread: thread, index: index) }
            }
        }
        workers.forEach { $0.start() }
        while workers.contains(where: { !$0.isFinished }) { try await Task.sleep(for: .milliseconds(5)) }
        let wall = clock.now - started
        let cpu = Self.processCPU() - cpu0
        let total = Double(perThread / 2 * 2 * threads)
        let wallSeconds = Double(wall.components.seconds) + Double(wall.components.attoseconds) / 1e18
        print(
            String(
                format: "log lines (%@, %d thread%@, to %@): %.2f µs CPU per line, %.2f µs wall per line per thread (%.0f lines)",
                format.rawValue, threads, threads == 1 ? "" : "s", output, cpu / total * 1e6, wallSeconds / Double(perThread / 2 * 2) * 1e6, total))
    }

    /// The receiver's accepted `delivery` line and the effect worker's applied `job` line, their
    /// metadata built as `NotificationsController` and `EffectWorker` build it.
    static func writeLinePair(_ logger: Logger, thread: Int, index: Int) {
        let jti = "bench-\(thread)-\(index)"
        let latency = Double(index % 5000) / 1000 + 2.5
        logger.info(
            "delivery",
            metadata: [
                "latency_ms": "\(latency)", "remote_addr": "\("127.0.0.1")", "jti": "\(jti)", "aud": "\("com.example.bench")",
                "type": "\("email-disabled")", "outcome": "accepted", "status": "\("pending")",
            ])
        logger.info(
            "job",
            metadata: [
                "outcome": "applied", "job_id": "\(index)", "jti": "\(jti)", "aud": "\("com.example.bench")", "type": "\("email-disabled")",
                "effect": "\("email_disabled")", "revoked_sessions": "\(0)", "worker": "\("bench-host:4242:ABCDEF/\(thread)")",
                "batch": "\(23)", "batch_ms": "\(latency)",
            ])
    }

    /// User and system CPU of the whole process, in seconds.
    static func processCPU() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}
