import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// Alert kinds are named once, by their rules: the schema checks a kind's form (sql/026), not a
/// list of kinds, and the OpenAPI document states that form; the CLI and the runbooks follow the
/// built-in rules.
@Suite("Alert kinds: named by their rules, checked by their form", .timeLimit(.minutes(10)))
struct AlertKindsTests {
    static let kinds = AlertMonitor.Configuration().registered.map(\.kind.rawValue)

    @Test("alerts and alert_silences take a kind of any rule, by its form, and refuse another form; openapi.yaml states the form")
    func schema() async throws {
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
            #expect(definition.contains(AlertKind.pattern) && !definition.contains("revocation_spike"), "\(constraint): \(definition)")
        }
        for kind in ["a_rule_of_a_test", "test"] + Self.kinds {
            try await client.query(
                """
                INSERT INTO alerts (kind, state, started_at, resolved_at, window_seconds, value, peak, threshold)
                VALUES (\(kind), 'resolved', now(), now(), 60, 1, 1, 1)
                """)
            try await client.query("INSERT INTO alert_silences (kind, until, created_by) VALUES (\(kind), now(), 'test')")
        }
        for kind in ["Revocation_spike", "queue-lag", "", String(repeating: "a", count: 41)] {
            #expect(AlertKind(rawValue: kind) == nil)
            await #expect(throws: PSQLError.self, "\(kind)") {
                try await client.query("INSERT INTO alert_silences (kind, until, created_by) VALUES (\(kind), now(), 'test')")
            }
        }

        let openAPI = try String(contentsOf: Repository.root.appendingPathComponent("Sources/SiwaHTTP/openapi.yaml"), encoding: .utf8)
        #expect(openAPI.contains("kind: {type: string, pattern: '\(AlertKind.pattern)'"), "openapi.yaml's alert kind is a string of the rules' form")
    }

    @Test("`alerts silence --help` and a runbook of docs/operations.md name every built-in kind")
    func named() async throws {
        #expect(Self.kinds.count == 9 && !Self.kinds.contains("test"), "\(Self.kinds)")
        let help = try await TestBinary.run(["alerts", "silence", "--help"], directory: FileManager.default.temporaryDirectory.path)
        for kind in Self.kinds { #expect(help.stdout.contains(kind), "alerts silence --help lacks \(kind)") }

        let operations = try String(contentsOf: Repository.root.appendingPathComponent("docs/operations.md"), encoding: .utf8)
        let runbooks = operations.split(separator: "\n").filter { $0.hasPrefix("### ") }
        for kind in Self.kinds {
            #expect(runbooks.contains { $0.hasPrefix("### \(kind) ") || $0 == "### \(kind)" }, "docs/operations.md has no runbook for \(kind)")
        }
    }
}
