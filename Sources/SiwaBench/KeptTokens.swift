import ArgumentParser
import Foundation
import SiwaDomain

/// Kept refresh tokens for the revocation benchmark, encrypted as `siwa-events` keeps them: one
/// `apple_tokens` row per line in PostgreSQL's COPY text format (aud, sub, client_id, token,
/// fingerprint). The tokens are random, as Apple's are opaque; the stand-in takes any of them.
struct KeptTokens: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kept-tokens", abstract: "Write N encrypted kept tokens as COPY lines for apple_tokens.")
    @Option(help: "The keyring, as SIWA_APPLE_TOKEN_KEYS.") var keys: String
    @Option(help: "Bundle ID (aud) and client ID.") var aud: String
    @Option(help: "How many.") var count: Int
    @Option(help: "Output file.") var output: String

    func run() async throws {
        let cipher = try AppleTokenCipher(keys: keys)
        let run = UUID().uuidString.prefix(8).lowercased()
        var lines: [String] = []
        lines.reserveCapacity(count)
        for index in 0..<count {
            let sub = "001\(index % 997).bench\(run).\(index)"
            let token = "r" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased() + ".0.bench"
            let ciphertext = cipher.encrypt(token, owner: AppleTokenOwner(aud: aud, sub: sub))
            lines.append([aud, sub, aud, ciphertext, AppleAuthRecord.fingerprint(token)].joined(separator: "\t"))
        }
        try (lines.joined(separator: "\n") + "\n").write(toFile: output, atomically: true, encoding: .utf8)
        print("wrote \(count) kept tokens into \(output)")
    }
}
