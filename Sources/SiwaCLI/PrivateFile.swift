import Foundation
// `stat`'s fields are declared by CoreFoundation's copy of the C headers in a release build
// (MemberImportVisibility then needs it imported); a debug build finds them through Glibc.
#if canImport(CoreFoundation)
import CoreFoundation
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A file the CLI writes for its user (private keys, exports with email addresses): written under a
/// new name beside the target (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 from its first byte), fsynced,
/// then renamed over the target. So it never writes through a symlink or into a file someone else
/// made, and the target is the old file or the whole new one, never half of it. A target that is a
/// symlink or another user's file is refused before anything is written.
final class PrivateFile {
    /// The target.
    let path: String
    /// Where the contents are written until `commit` renames it to `path`.
    let temporaryPath: String
    let handle: FileHandle
    /// The handle is closed (by `commit`), so `discard` only removes the file.
    private var closed = false

    /// `mode`: 0600 (only its owner reads it) unless the contents are public, e.g. a key set.
    init(creating path: String, mode: mode_t = 0o600) throws(PrivateFileError) {
        self.path = path
        var status = stat()
        if lstat(path, &status) == 0 {
            switch status.st_mode & S_IFMT {
            case S_IFLNK:
                let destination = (try? FileManager.default.destinationOfSymbolicLink(atPath: path)).map { " (to \($0))" } ?? ""
                throw PrivateFileError(path: path, reason: "it is a symbolic link\(destination); remove it, or name the file itself")
            case S_IFREG:
                guard status.st_uid == geteuid() else {
                    throw PrivateFileError(
                        path: path, reason: "it belongs to another user (uid \(status.st_uid), not \(geteuid())); remove it, or choose another path")
                }
            default:
                throw PrivateFileError(path: path, reason: "it is not a regular file; choose another path")
            }
        } else if errno != ENOENT {
            throw PrivateFileError(path: path, reason: String(cString: strerror(errno)))
        }
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        var descriptor: Int32 = -1
        var temporaryPath = ""
        for _ in 0..<8 where descriptor < 0 {
            let suffix = String(UInt64.random(in: 0...UInt64.max), radix: 36)
            temporaryPath = "\(directory)/.\(url.lastPathComponent).\(suffix).tmp"
            InterruptCleanup.arm(temporaryPath)  // before it exists: no moment it could be left behind
            descriptor = open(temporaryPath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard descriptor >= 0 || errno == EEXIST else { break }
        }
        guard descriptor >= 0 else {
            let reason = String(cString: strerror(errno))
            InterruptCleanup.disarm()
            throw PrivateFileError(path: path, reason: reason)
        }
        // The umask may have narrowed the mode; a public key set is widened to what was asked.
        if fchmod(descriptor, mode) != 0 {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            unlink(temporaryPath)
            InterruptCleanup.disarm()
            throw PrivateFileError(path: path, reason: reason)
        }
        self.temporaryPath = temporaryPath
        self.handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
    }

    /// Flushes the new contents to disk and puts them in the target's place (the rename replaces
    /// the directory entry, never writes through it).
    func commit() throws(PrivateFileError) {
        do {
            try handle.synchronize()
            closed = true
            try handle.close()
        } catch {
            throw PrivateFileError(path: path, reason: "\(error)")
        }
        guard rename(temporaryPath, path) == 0 else { throw PrivateFileError(path: path, reason: String(cString: strerror(errno))) }
        InterruptCleanup.disarm()
        // The rename itself on disk too (best effort: some file systems refuse a directory's fsync).
        let directory = open(URL(fileURLWithPath: path).deletingLastPathComponent().path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directory >= 0 {
            _ = fsync(directory)
            close(directory)
        }
    }

    /// Removes the unfinished new file; the target stays as it was.
    func discard() {
        if !closed { try? handle.close() }
        closed = true
        unlink(temporaryPath)
        InterruptCleanup.disarm()
    }

    /// Writes `data` to `path` whole, or leaves `path` as it was.
    static func write(_ data: Data, to path: String, mode: mode_t = 0o600) throws(PrivateFileError) {
        let file = try PrivateFile(creating: path, mode: mode)
        do {
            try file.handle.write(contentsOf: data)
        } catch {
            file.discard()
            throw PrivateFileError(path: path, reason: "\(error)")
        }
        do {
            try file.commit()
        } catch {
            file.discard()
            throw error
        }
    }
}

/// While a `PrivateFile` is being written, SIGINT and SIGTERM remove its new file before ending the
/// process as they would have (a long export interrupted with Ctrl-C leaves nothing beside the
/// target). A signal the process ignored stays ignored. One file at a time, as the CLI writes them.
private enum InterruptCleanup {
    /// The new file's path, for the handler (which may only call async-signal-safe functions).
    nonisolated(unsafe) static var path: UnsafeMutablePointer<CChar>?
    static let signals = [SIGINT, SIGTERM]

    static func arm(_ temporaryPath: String) {
        disarm()
        path = strdup(temporaryPath)
        for number in signals {
            let previous = signal(number, removeTemporaryFileAndReraise)
            if let previous, unsafeBitCast(previous, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self) { signal(number, previous) }
        }
    }

    static func disarm() {
        guard let armed = path else { return }
        for number in signals {
            let current = signal(number, SIG_DFL)
            if let current, unsafeBitCast(current, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self) { signal(number, current) }
        }
        path = nil
        free(armed)
    }
}

private func removeTemporaryFileAndReraise(_ number: Int32) {
    if let path = InterruptCleanup.path { unlink(path) }
    signal(number, SIG_DFL)
    raise(number)
}

/// A file the CLI refused or failed to write: names the path, why, and what to do.
struct PrivateFileError: Error, CustomStringConvertible {
    let path: String
    let reason: String
    var description: String { "cannot write \(path): \(reason)" }
}
