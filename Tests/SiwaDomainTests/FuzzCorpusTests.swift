import Foundation
import SiwaDomain
import Testing

/// The fuzz corpus (`fuzz/corpus/`: real Apple tokens, adversarial seeds, and every input
/// `scripts/fuzz` ever crashed on) replayed through the fuzz target's own function,
/// `FuzzHarness.run`, then fixed-seed mutations of each: the same inputs and the same runs every
/// time, so a crash once found stays fixed.
@Suite("Fuzz corpus replay", .timeLimit(.minutes(10)))
struct FuzzCorpusTests {
    static let directory: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }  // Tests/SiwaDomainTests/FuzzCorpusTests.swift → repo
        return url.appendingPathComponent("fuzz/corpus")
    }()

    static let names: [String] = ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).sorted()

    /// Mutations of each input per run; enough to leave every seed's shape (see BENCHMARKS.md).
    static let mutationsPerInput = 500

    static func input(_ name: String) throws -> [UInt8] {
        Array(try Data(contentsOf: directory.appendingPathComponent(name)))
    }

    @Test("The corpus is there: real Apple tokens and adversarial seeds")
    func corpusIsThere() {
        #expect(Self.names.count >= 50, "no fuzz corpus at \(Self.directory.path)")
        #expect(Self.names.contains("real-consent-revoked-body.json"))
    }

    @Test("Every corpus input goes through the receiver's parsers with every property kept", arguments: names)
    func replay(name: String) throws {
        let broken = FuzzHarness.run(try Self.input(name))
        #expect(broken == nil, "\(name): \(broken ?? "")")
    }

    @Test("Fixed-seed mutations of every corpus input keep every property", arguments: names)
    func mutations(name: String) throws {
        let original = try Self.input(name)
        // SplitMix64 (AlertingTests.swift), seeded by the name, so adding a file leaves the other files' mutations as they were.
        var random = SplitMix64(seed: name.utf8.reduce(UInt64(0xCBF2_9CE4_8422_2325)) { ($0 ^ UInt64($1)) &* 0x100_0000_01B3 })
        for run in 0..<Self.mutationsPerInput {
            let mutated = Mutator.mutate(original, using: &random)
            if let broken = FuzzHarness.run(mutated) {
                Issue.record("\(name), mutation \(run): \(broken); input (base64): \(Data(mutated).base64EncodedString())")
                return
            }
        }
    }
}

/// libFuzzer-like byte mutations, one to four per input, biased toward what the parsers treat
/// specially (quotes, escapes, dots, brackets, bytes that are not UTF-8).
enum Mutator {
    static let bytes: [UInt8] = [0x00, 0x20, 0x22, 0x2E, 0x2D, 0x30, 0x3D, 0x5B, 0x5C, 0x5D, 0x65, 0x7B, 0x7D, 0x7F, 0x80, 0xC0, 0xED, 0xFF]
    static let tokens: [[UInt8]] = [".", "\\u", "\\ud800", "\\udc00", "[", "{", "\"", "\\", "eyJ", "==", "1e999", "-0", " ", "\u{2028}"]
        .map { Array($0.utf8) }

    static func mutate(_ input: [UInt8], using random: inout SplitMix64) -> [UInt8] {
        var bytes = input
        for _ in 0..<Int.random(in: 1...4, using: &random) {
            let at = Int.random(in: 0...bytes.count, using: &random)
            switch Int.random(in: 0..<6, using: &random) {
            case 0 where at < bytes.count:
                bytes[at] ^= 1 << UInt8.random(in: 0..<8, using: &random)
            case 1 where at < bytes.count:
                bytes[at] = Self.bytes.randomElement(using: &random)!
            case 2:
                bytes.insert(contentsOf: tokens.randomElement(using: &random)!, at: at)
            case 3:
                bytes.removeSubrange(at..<min(bytes.count, at + Int.random(in: 1...16, using: &random)))
            case 4:
                let chunk = Array(bytes[at..<min(bytes.count, at + Int.random(in: 1...64, using: &random))])
                let to = Int.random(in: 0...bytes.count, using: &random)
                bytes.insert(contentsOf: chunk, at: to)
            default:
                bytes.removeSubrange(at..<bytes.count)
            }
        }
        return bytes
    }
}
