import Foundation
import SiwaTestSupport
import Testing

/// A clone of the repository alone is the whole project: nothing the suite, the scripts or CI run
/// reads a directory beside the checkout.
@Suite("The repository stands alone", .timeLimit(.minutes(10)))
struct RepositoryTests {
    @Test("no file under Sources, Tests, scripts or .ci reads the shared directory beside the checkout; the Apple fixtures are in Tests/fixtures/apple-real")
    func nothingReadsBesideTheCheckout() throws {
        let needles = [".." + "/shared", "shared" + "/fixtures"]
        var offenders: [String] = []
        for folder in ["Sources", "Tests", "scripts", ".ci"] {
            let root = Repository.root.appendingPathComponent(folder)
            guard let files = FileManager.default.enumerator(at: root, includingPropertiesForKeys: [.isRegularFileKey]) else { continue }
            for case let file as URL in files where (try? file.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true {
                guard let text = try? String(contentsOf: file, encoding: .utf8) else { continue }
                if needles.contains(where: text.contains) { offenders.append(file.path.replacingOccurrences(of: Repository.root.path + "/", with: "")) }
            }
        }
        #expect(offenders.isEmpty, "\(offenders)")
        for name in ["consent-revoked.json", "email-disabled.json", "identity-token.json", "jwks.json", "README.md"] {
            #expect(FileManager.default.fileExists(atPath: Repository.appleFixtures.appendingPathComponent(name).path), "\(name)")
        }
    }

    /// A notification's row changes in one place, so its status rules cannot drift apart.
    @Test("one file writes the notifications table: NotificationStore.swift holds every INSERT, UPDATE and DELETE of it")
    func oneHomeForNotifications() throws {
        let write = try Regex("(?i)(INSERT\\s+INTO|UPDATE|DELETE\\s+FROM)\\s+notifications\\b")
        var writers: Set<String> = []
        let root = Repository.root.appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil))
        for case let file as URL in files where file.pathExtension == "swift" && !file.path.contains("/SiwaTestSupport/") {
            let text = try String(contentsOf: file, encoding: .utf8)
            if text.contains(write) { writers.insert(file.path.replacingOccurrences(of: Repository.root.path + "/", with: "")) }
        }
        #expect(writers == ["Sources/SiwaStore/NotificationStore.swift"])
    }

    /// What lets the previous release keep running while a new one migrates (docs/operations.md,
    /// "Upgrades"): no migration takes away or changes what an older binary reads or writes.
    @Test("migrations are additive: none drops or renames a table or column, changes a column's type, or adds NOT NULL an older binary's inserts would miss")
    func migrationsAreAdditive() throws {
        let folder = Repository.root.appendingPathComponent("sql")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files.count >= 15)
        let forbidden = [
            #"DROP\s+TABLE"#, #"DROP\s+COLUMN"#, #"\bRENAME\b"#, #"ALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE"#, #"SET\s+NOT\s+NULL"#,
            #"DROP\s+TYPE"#, #"ADD\s+COLUMN\s+[^,;]*NOT\s+NULL(?![^,;]*DEFAULT)"#,
        ]
        for file in files where file != "001_receiver.sql" {
            let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
                .split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("--") }.joined(separator: "\n")
            for pattern in forbidden {
                #expect(text.range(of: pattern, options: [.regularExpression, .caseInsensitive]) == nil, "\(file): \(pattern)")
            }
        }
    }
}

