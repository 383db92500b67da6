import Foundation
import SiwaTestSupport
import Testing

/// A hung test fails on its own, not by cutting the whole run: every suite carries a time limit
/// per test (`.timeLimit(.minutes(10))`, or a shorter one), so a run that is merely slow, on a
/// machine three times slower than ours, still passes, and a hang is named.
@Suite("Every suite limits the time of each of its tests", .timeLimit(.minutes(10)))
struct SuiteTimeLimitTests {
    @Test("each @Suite under Tests/ declares a .timeLimit")
    func everySuiteHasALimit() throws {
        let root = Repository.root.appendingPathComponent("Tests")
        let files = try #require(FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil))
        var suites = 0
        var unlimited: [String] = []
        for case let file as URL in files where file.pathExtension == "swift" {
            let text = try String(contentsOf: file, encoding: .utf8)
            for line in text.split(separator: "\n") where line.hasPrefix("@Suite") {
                suites += 1
                if !line.contains(".timeLimit(") { unlimited.append("\(file.lastPathComponent): \(line)") }
            }
        }
        #expect(suites > 50, "found \(suites) suites: is Tests/ where the suites are?")
        #expect(unlimited.isEmpty, "suites without a time limit:\n\(unlimited.joined(separator: "\n"))")
    }
}
