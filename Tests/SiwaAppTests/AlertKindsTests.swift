import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// Alert kinds are named once, by their rules: the CLI and the runbooks follow the built-in rules.
@Suite("Alert kinds: named by their rules")
struct AlertKindsTests {
    static let kinds = AlertMonitor.Configuration().registered.map(\.kind.rawValue)

    @Test("`alerts silence --help` and a runbook of docs/operations.md name every built-in kind")
    func named() async throws {
        #expect(Self.kinds.count == 8 && !Self.kinds.contains("test"), "\(Self.kinds)")
        let help = try await TestBinary.run(["alerts", "silence", "--help"], directory: FileManager.default.temporaryDirectory.path)
        for kind in Self.kinds { #expect(help.stdout.contains(kind), "alerts silence --help lacks \(kind)") }

        let operations = try String(contentsOf: Repository.root.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let runbooks = operations.split(separator: "\n").filter { $0.hasPrefix("### ") }
        for kind in Self.kinds {
            #expect(runbooks.contains { $0.hasPrefix("### \(kind) ") || $0 == "### \(kind)" }, "docs/operations.md has no runbook for \(kind)")
        }
    }
}
