#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// Opens `path` for writing as a file only its owner can read (0600), from its first byte: created
/// with that mode, or, if it exists, truncated and set to it before anything is written. For files
/// that hold secrets or personal data (private keys, exports with email addresses).
func openPrivateFile(_ path: String) throws -> FileHandle {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard descriptor >= 0 else { throw PrivateFileError(path: path, reason: String(cString: strerror(errno))) }
    guard fchmod(descriptor, 0o600) == 0 else {
        let reason = String(cString: strerror(errno))
        close(descriptor)
        throw PrivateFileError(path: path, reason: reason)
    }
    return FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
}

/// Writes `data` to `path` through `openPrivateFile`.
func writePrivateFile(_ data: Data, to path: String) throws {
    let handle = try openPrivateFile(path)
    try handle.write(contentsOf: data)
    try handle.close()
}

struct PrivateFileError: Error, CustomStringConvertible {
    let path: String
    let reason: String
    var description: String { "cannot create \(path): \(reason)" }
}
