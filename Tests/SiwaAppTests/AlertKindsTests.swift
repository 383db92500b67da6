import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// Alert kinds come from one enum, `AlertKind`: the database's checks, the OpenAPI document, the
/// CLI and the runbooks all name exactly its cases.
@Suite("Alert kinds: one enum, named the same everywhere")
struct AlertKindsTests {
    static let kinds = Set(AlertKind.allCases.map(\.rawValue))

    @Test("the alerts and alert_silences CHECKs, openapi.yaml's enum, `alerts silence --help` and a runbook each")
    func everywhere() async throws {
        let client = PostgresClient(configuration: try await TestCluster.shared.makeDatabase())
        let running = Task { await client.run() }
        defer { running.cancel() }
        for constraint in ["alerts_kind_check", "alert_silences_kind_check"] {
            var definition = ""
            for try await (text,) in try await client.query(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = \(constraint)"
            ).decode((String,).self) {
                definition = text
            }
            let named = Set(definition.matches(of: /'([a-z_]+)'/).map { String($0.output.1) })
            #expect(named == Self.kinds, "\(constraint): \(definition)")
        }

        let openAPI = try String(contentsOf: Repository.root.appendingPathComponent("Sources/SiwaHTTP/openapi.yaml"), encoding: .utf8)
        let line = try #require(openAPI.split(separator: "\n").first { $0.contains("kind: {type: string, enum: [revocation_spike") })
        let listed = Set(line.split(separator: "[").last!.split(separator: "]").first!.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
        #expect(listed == Self.kinds)

        let help = try await TestBinary.run(["alerts", "silence", "--help"], directory: FileManager.default.temporaryDirectory.path)
        for kind in Self.kinds.subtracting(["test"]) { #expect(help.stdout.contains(kind), "alerts silence --help lacks \(kind)") }

        let operations = try String(contentsOf: Repository.root.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let runbooks = operations.split(separator: "\n").filter { $0.hasPrefix("### ") }
        for kind in Self.kinds.subtracting(["test"]) {
            #expect(runbooks.contains { $0.hasPrefix("### \(kind) ") || $0 == "### \(kind)" }, "docs/operations.md has no runbook for \(kind)")
        }
    }
}
