import Foundation
import SiwaApp

// How the transfer commands drive Apple: paced calls, a progress line on a terminal.

extension TransfersCommand {
    /// Runs `batch` (a runner's `runOnce`) a hundred at a time, its calls `1/rate` s apart, with a
    /// progress line over the `pending` users, until none is left; returns why Apple stopped it
    /// early (nil: done), for the caller to report after its summary.
    static func drive(
        pending: Int, batch: (Int) async throws -> Int
    ) async throws -> AppleMigrationCalls.Stopped? {
        let meter = ProgressLine(total: pending)
        defer { meter.finish() }
        var done = 0
        do {
            while case let asked = try await batch(100), asked > 0 {
                done += asked
                meter.show(done: done)
            }
        } catch let stopped as AppleMigrationCalls.Stopped {
            return stopped
        }
        return nil
    }
}

/// A progress line on stderr when it is a terminal (rewritten in place), nothing otherwise.
final class ProgressLine: Sendable {
    let total: Int
    private let terminal = isatty(STDERR_FILENO) == 1

    init(total: Int) { self.total = total }

    func show(done: Int) {
        guard terminal, total > 0 else { return }
        let width = 30
        let filled = min(width, done * width / total)
        FileHandle.standardError.write(Data("\r[\(String(repeating: "#", count: filled))\(String(repeating: ".", count: width - filled))] \(done)/\(total)".utf8))
    }

    func finish() {
        if terminal && total > 0 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
