import Foundation

/// Tools the suite runs that `scripts/test` installs (python3 with selenium and PyYAML, schemathesis'
/// `st`): found on PATH, where scripts/test puts its virtual environment first, as a shell would.
package enum Executables {
    package static func find(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}
