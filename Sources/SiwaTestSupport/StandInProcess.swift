import Foundation
import SiwaEmbeddedPostgres
import Testing

/// `siwa-events standin serve` as a user runs it, in `directory`: local keys made first in `keys`
/// (unless there already), team TEAMID1234 with key KEYID12345 (its `.p8` written to
/// `<keys>/AuthKey_KEYID12345.p8`), one client ID; started on a port of its own choosing and read
/// from its output.
package struct StandInProcess {
    package let process: ChildProcess
    package let output: ChildOutput
    /// Its base URL, `http://127.0.0.1:<port>`.
    package let base: String

    package static let teamID = "TEAMID1234"
    package static let keyID = "KEYID12345"

    /// `arguments` are added to `serve`'s (e.g. a recipient team).
    package static func start(
        in directory: String, keys: String = "keys", clientIDs: String = "com.example.app", arguments: [String] = []
    ) async throws -> StandInProcess {
        if !FileManager.default.fileExists(atPath: "\(directory)/\(keys)/jwks.json") {
            #expect(try await TestBinary.run(["keys", "generate", "--dir", keys], directory: directory).status == 0)
        }
        let (process, output) = try ChildOutput.start(
            TestBinary.url.path,
            ["standin", "serve", "--keys", keys, "--port", "0", "--team-id", teamID, "--key-id", keyID, "--client-ids", clientIDs] + arguments,
            environment: ProcessInfo.processInfo.environment, workingDirectory: directory)
        return try await listening(process, output)
    }

    /// The started stand-in once it says where it listens (killed if it does not within a minute).
    private static func listening(_ process: ChildProcess, _ output: ChildOutput) async throws -> StandInProcess {
        guard await output.wait(forLineWith: ["a code: siwa-events standin code"], within: .seconds(60)),
            let line = output.text.split(separator: "\n").first(where: { $0.hasPrefix("standin listening on http://127.0.0.1:") })
        else {
            process.signal(SIGKILL)
            throw StandInDidNotStart(output: output.text)
        }
        return StandInProcess(process: process, output: output, base: String(line.dropFirst("standin listening on ".count)))
    }

    /// A README block that starts the stand-in, run as a user in a new terminal runs it: a fresh
    /// `bash` in `directory` with only the system's PATH (the block must set its own), on a port of
    /// its own choosing instead of the block's, and read from its output.
    package static func start(block: String, port: Int, in directory: String) async throws -> StandInProcess {
        let script = block.replacingOccurrences(of: "--port \(port)", with: "--port 0")
            .replacingOccurrences(of: "\nsiwa-events standin serve", with: "\nexec siwa-events standin serve")
        let environment = ["PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/root"]
        let (process, output) = try ChildOutput.start("/bin/bash", ["-c", script], environment: environment, workingDirectory: directory)
        return try await listening(process, output)
    }

    /// The `.p8` that `serve` made for the team's key.
    package static func keyFile(in directory: String, keys: String = "keys") -> String { "\(directory)/\(keys)/AuthKey_\(keyID).p8" }
}

package struct StandInDidNotStart: Error, CustomStringConvertible {
    let output: String
    package var description: String { "standin serve did not say it was listening within 60 s: \(output)" }
}
