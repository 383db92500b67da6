import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A process's end as events, through a pidfd (Linux): readable (POLLIN) once the process has
/// exited, POLLHUP once its parent has reaped it. Not the same moment: a zombie still answers
/// `kill(pid, 0)`, and a busy init may take seconds to reap an orphan. (POLLHUP at reaping
/// needs a recent kernel, checked on 6.18: on an older one `reaped` waits out its limit.)
package final class ProcessEnd: Sendable {
    package let pid: pid_t
    /// -1: the process was gone (reaped) before we looked.
    private let descriptor: Int32

    /// Watches `pid`, gone already or not; throws only when the kernel gives no pidfd.
    package init(pid: pid_t) throws {
        self.pid = pid
        typealias Open = @convention(c) (pid_t, UInt32) -> Int32
        // glibc 2.36 has the wrapper; Swift's Glibc module does not declare it.
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pidfd_open") else { throw POSIXError(.ENOSYS) }
        let descriptor = unsafeBitCast(symbol, to: Open.self)(pid, 0)
        guard descriptor >= 0 || errno == ESRCH else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        self.descriptor = descriptor
    }

    deinit { if descriptor >= 0 { close(descriptor) } }

    /// Sends `signal` through the pidfd: to this process, never to one that took over its pid.
    package func signal(_ signal: Int32) -> Bool {
        typealias Send = @convention(c) (Int32, Int32, UnsafeMutableRawPointer?, UInt32) -> Int32
        guard descriptor >= 0, let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pidfd_send_signal") else { return false }
        return unsafeBitCast(symbol, to: Send.self)(descriptor, signal, nil, 0) == 0
    }

    /// Whether the process exits within `limit` (a zombie may remain).
    package func exited(within limit: Duration) async -> Bool { await poll(for: Int16(POLLIN), within: limit) }

    /// Whether the process is reaped within `limit`: from then on no one finds it by its pid.
    package func reaped(within limit: Duration) async -> Bool { await poll(for: Int16(POLLHUP), within: limit) }

    /// `poll` on the pidfd, on a thread of its own. POLLHUP needs no asking: `events` 0 waits for it alone.
    private func poll(for event: Int16, within limit: Duration) async -> Bool {
        guard descriptor >= 0 else { return true }
        let deadline = ContinuousClock.now + limit
        return await withCheckedContinuation { continuation in
            Thread { [self] in
                var entry = pollfd(fd: descriptor, events: event == Int16(POLLHUP) ? 0 : event, revents: 0)
                while true {
                    let left = deadline - .now
                    let milliseconds = max(0, Int32(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
                    let ready = Glibc.poll(&entry, 1, milliseconds)
                    if ready < 0 && errno == EINTR { continue }
                    return continuation.resume(returning: ready > 0 && entry.revents & event != 0)
                }
            }.start()
        }
    }
}

/// A PostgreSQL crash: the postmaster SIGKILLed (no shutdown checkpoint; postmaster.pid left
/// behind). Returns once a new postmaster can start on the data directory — the old one reaped
/// (a zombie answers `kill(pid, 0)`, and pg_ctl and postgres ask that of postmaster.pid's pid)
/// and the backends it orphaned exited (until then they hold its shared memory, and postgres
/// refuses to start: "pre-existing shared memory block ... is still in use").
package enum PostmasterCrash {
    package struct Failed: Error, CustomStringConvertible {
        package let description: String
    }

    package static func kill(pgdata: String, within limit: Duration = .seconds(30)) async throws {
        let pidFile = "\(pgdata)/postmaster.pid"
        guard let line = try? String(contentsOfFile: pidFile, encoding: .utf8).split(separator: "\n").first, let pid = pid_t(line) else {
            throw Failed(description: "no postmaster pid in \(pidFile)")
        }
        let postmaster = try ProcessEnd(pid: pid)
        guard postmaster.signal(SIGKILL) else { throw Failed(description: "could not SIGKILL the postmaster \(pid): \(String(cString: strerror(errno)))") }
        guard await postmaster.reaped(within: limit) else { throw Failed(description: "the postmaster \(pid) was not reaped within \(limit) of SIGKILL") }
        // Its children are orphans now, their parent final: each has the data directory as its working directory.
        let directory = URL(fileURLWithPath: pgdata).resolvingSymlinksInPath().path
        let orphans = try processes(workingIn: directory).map { try ProcessEnd(pid: $0) }
        let deadline = ContinuousClock.now + limit
        var left: [pid_t] = []
        for orphan in orphans where !(await orphan.exited(within: deadline - .now)) { left.append(orphan.pid) }
        guard left.isEmpty else { throw Failed(description: "the backends \(left) of the killed postmaster \(pid) did not exit within \(limit)") }
    }

    /// Live processes whose working directory is `directory` (a zombie has none).
    static func processes(workingIn directory: String) throws -> [pid_t] {
        try FileManager.default.contentsOfDirectory(atPath: "/proc").compactMap { entry in
            guard let pid = pid_t(entry), (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(entry)/cwd")) == directory else { return nil }
            return pid
        }
    }
}
