import Foundation
import SiwaTestSupport
import Testing

/// A clone of the repository alone is the whole project: nothing the suite, the scripts or CI run
/// reads a directory beside the checkout.
@Suite("The repository stands alone")
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
}
