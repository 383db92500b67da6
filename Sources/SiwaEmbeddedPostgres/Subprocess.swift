import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a finished child process left behind.
package struct CommandResult: Sendable {
    /// The exit status, or the signal number when `terminatedBySignal` is true.
    package var status: Int32
    package var terminatedBySignal: Bool
    package var standardOutput: String
    package var standardError: String

    package var succeeded: Bool { !terminatedBySignal && status == 0 }

    init(waitStatus: Int32, standardOutput: String, standardError: String) {
        let signaled = waitStatus & 0x7f != 0
        self.status = signaled ? waitStatus & 0x7f : (waitStatus >> 8) & 0xff
        self.terminatedBySignal = signaled
        self.standardOutput = standardOutput
        self.standardError = standardError
    }

    /// Both streams, for error messages (PostgreSQL tools split their chatter between them).
    package var combinedOutput: String {
        let text = [standardOutput, standardError]
            .map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
            .filter { !$0.isEmpty }
            .joined(separator: "\n")
        let exit = terminatedBySignal ? "killed by signal \(status)" : "exit status \(status)"
        return text.isEmpty ? "(\(exit), no output)" : "\(text)\n(\(exit))"
    }
}

/// Runs one child process to completion without blocking the cooperative thread pool.
///
/// Not Foundation's `Process`: on Linux it sees a child exit through a socket the child inherits,
/// which a postmaster left by `pg_ctl start` holds forever. We posix_spawn and reap on a thread of
/// our own. The child gets /dev/null as stdin, unlinked temporary files as stdout/stderr, no other
/// descriptor of ours, default signals, its own process group, and "/" as working directory
/// unless told otherwise (the cluster's account may not enter ours).
package enum Subprocess {
    package static func run(
        _ executable: String,
        _ arguments: [String],
        environment: [String: String],
        workingDirectory: String = "/"
    ) async throws -> CommandResult {
        try Task.checkCancellation()
        let stdout = try CaptureFile()
        let stderr = try CaptureFile()
        let child = try ChildProcess(
            spawning: executable, arguments: arguments, environment: environment, workingDirectory: workingDirectory,
            standardOutput: stdout.descriptor, standardError: stderr.descriptor)
        let waitStatus = await withTaskCancellationHandler {
            await child.waitForExit()
        } onCancel: {
            child.signal(SIGTERM)
        }
        return CommandResult(waitStatus: waitStatus, standardOutput: stdout.contents(), standardError: stderr.contents())
    }

    /// Starts a long-running child whose output goes to `outputPath` (appended; default /dev/null);
    /// the caller signals and awaits it.
    package static func start(
        _ executable: String,
        _ arguments: [String],
        environment: [String: String],
        workingDirectory: String = "/",
        outputPath: String = "/dev/null"
    ) throws -> ChildProcess {
        let output = open(outputPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        defer { if output >= 0 { close(output) } }
        return try start(executable, arguments, environment: environment, workingDirectory: workingDirectory, output: output)
    }

    /// Starts a long-running child whose stdout and stderr go to `output` (a descriptor the caller
    /// keeps and closes: e.g. a pipe's write end).
    package static func start(
        _ executable: String,
        _ arguments: [String],
        environment: [String: String],
        workingDirectory: String = "/",
        output: Int32
    ) throws -> ChildProcess {
        try ChildProcess(
            spawning: executable, arguments: arguments, environment: environment, workingDirectory: workingDirectory,
            standardOutput: output, standardError: output)
    }
}

/// A spawned child, until it has been reaped.
package final class ChildProcess: @unchecked Sendable {
    package let pid: pid_t
    private let lock = NSLock()
    private var reaped = false // guarded by `lock`

    init(
        spawning executable: String, arguments: [String], environment: [String: String], workingDirectory: String,
        standardOutput: Int32, standardError: Int32
    ) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, standardOutput, 1)
        posix_spawn_file_actions_adddup2(&actions, standardError, 2)
        if let addClosefrom = Self.addClosefrom() {
            _ = addClosefrom(&actions, 3)
        } else {
            for descriptor in Self.inheritableDescriptors() {
                posix_spawn_file_actions_addclose(&actions, descriptor)
            }
        }
        if let addChdir = Self.addChdir() {
            _ = addChdir(&actions, workingDirectory)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

        let argv = ([executable] + arguments).map { strdup($0) }
        let envp = environment.map { strdup("\($0.key)=\($0.value)") }
        defer { (argv + envp).forEach { free($0) } }

        var pid = pid_t()
        let status = posix_spawn(&pid, executable, &actions, &attributes, argv + [nil], envp + [nil])
        guard status == 0 else {
            throw EmbeddedPostgresError.commandFailed(
                command: ([executable] + arguments).joined(separator: " "),
                output: "could not start it: \(String(cString: strerror(status)))")
        }
        self.pid = pid
    }

    /// Waits on a dedicated thread (waitpid blocks). `waitid(WNOWAIT)` first, so the pid stays
    /// ours — and `signal(_:)` cannot hit a recycled pid — until we reap it under the lock.
    /// Returns the raw wait status (see `CommandResult`).
    package func waitForExit() async -> Int32 {
        await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            let thread = Thread { [self] in
                continuation.resume(returning: waitBlocking())
            }
            thread.name = "siwa-wait-\(pid)"
            thread.start()
        }
    }

    /// The same, blocking the calling thread (for exit handlers; never on the cooperative pool).
    package func waitBlocking() -> Int32 {
        var info = siginfo_t()
        while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR {}
        var status: Int32 = 0
        lock.lock()
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        reaped = true
        lock.unlock()
        return status
    }

    /// Sends a signal unless the child has been reaped already (SIGTERM on cancellation: initdb
    /// cleans up after itself; pg_ctl gives up waiting).
    package func signal(_ signal: Int32) {
        lock.lock()
        defer { lock.unlock() }
        if !reaped { kill(pid, signal) }
    }

    /// Our descriptors ≥ 3 without close-on-exec, which the child would otherwise inherit
    /// (and the postmaster after it, for as long as it runs).
    private static func inheritableDescriptors() -> [Int32] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return names.compactMap { Int32($0) }.filter { descriptor in
            guard descriptor > 2 else { return false }
            let flags = fcntl(descriptor, F_GETFD)
            return flags >= 0 && flags & FD_CLOEXEC == 0
        }
    }

    private typealias AddClosefrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32

    /// `posix_spawn_file_actions_addclosefrom_np` (glibc ≥ 2.34): closes everything from 3 up
    /// in the child, including descriptors other threads open while we spawn. Older libcs get
    /// the /proc/self/fd enumeration instead.
    private static func addClosefrom() -> AddClosefrom? {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np")
        else { return nil }
        return unsafeBitCast(symbol, to: AddClosefrom.self)
    }

    private typealias AddChdir = @convention(c) (
        UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>
    ) -> Int32

    /// `posix_spawn_file_actions_addchdir_np` (glibc ≥ 2.29, musl ≥ 1.1.24) is not exposed to
    /// Swift; without it the child keeps our working directory, which only costs warnings.
    private static func addChdir() -> AddChdir? {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addchdir_np")
        else { return nil }
        return unsafeBitCast(symbol, to: AddChdir.self)
    }
}

/// An anonymous temporary file that a child writes one output stream into.
private final class CaptureFile {
    private let handle: FileHandle
    var descriptor: Int32 { handle.fileDescriptor }

    init() throws {
        var template = Array("\(NSTemporaryDirectory())/siwa-pg-out-XXXXXX".utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard fd >= 0 else {
            throw EmbeddedPostgresError.fileSystem(
                operation: "create a temporary file in", path: NSTemporaryDirectory(),
                reason: String(cString: strerror(errno)))
        }
        template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) }
        // Only the child we hand it to (through dup2, which clears the flag) may have it.
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    /// The child shared our file offset, so rewind before reading what it wrote.
    func contents() -> String {
        guard (try? handle.seek(toOffset: 0)) != nil, let data = try? handle.readToEnd() else { return "" }
        return String(decoding: data, as: UTF8.self)
    }
}
