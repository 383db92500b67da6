import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// glibc's (2.36+) wrapper of the pidfd_open system call, which Swift's Glibc module leaves out.
@_silgen_name("pidfd_open")
private func pidfd_open(_ pid: pid_t, _ flags: UInt32) -> Int32

/// The exit of a process that is not our child (a postmaster started by pg_ctl or by a killed
/// child), as an event: a pidfd becomes readable when the process exits, so nothing polls `kill(pid, 0)`.
package enum ProcessExit {
    /// Whether process `pid` has exited (or was gone already) within `limit`.
    package static func wait(pid: pid_t, within limit: Duration) async -> Bool {
        let descriptor = pidfd_open(pid, 0)
        if descriptor < 0 { return errno == ESRCH }
        return await withCheckedContinuation { continuation in
            Thread {
                defer { close(descriptor) }
                var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                let milliseconds = Int32(limit.components.seconds * 1000 + limit.components.attoseconds / 1_000_000_000_000_000)
                var ready: Int32
                repeat { ready = poll(&entry, 1, milliseconds) } while ready < 0 && errno == EINTR
                continuation.resume(returning: ready > 0)
            }.start()
        }
    }

    /// The processes whose parent is `pid` now (from /proc): a postmaster's backends, say, whose
    /// exit a test can then wait on as on the postmaster's.
    package static func children(of pid: pid_t) -> [pid_t] {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
        return entries.compactMap { entry -> pid_t? in
            guard let child = pid_t(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                let end = stat.range(of: ")", options: .backwards)
            else { return nil }
            // "pid (comm) state ppid …": comm may hold spaces and parentheses, so read after its last ')'.
            let fields = stat[end.upperBound...].split(separator: " ")
            return fields.count > 1 && pid_t(fields[1]) == pid ? child : nil
        }
    }

    /// Whether every process of `pids` has exited within `limit`.
    package static func wait(pids: [pid_t], within limit: Duration) async -> Bool {
        var all = true
        for pid in pids where !(await wait(pid: pid, within: limit)) { all = false }
        return all
    }
}
