import Foundation
import SiwaStore
import SiwaTestSupport
import Testing

/// The docs held to the code: docs/architecture.md names every module (Package.swift's targets),
/// every loop (each type under Sources/ declared a `Service`) and every lane (`Lane.all`), found
/// by reading the code, so a new one fails here until the page names it; and every relative link
/// of the docs leads to a file and, with a `#`, to a heading of it.
@Suite("The docs hold to the code", .timeLimit(.minutes(10)))
struct ArchitectureDocTests {
    static let page = "docs/architecture.md"

    static func read(_ path: String) throws -> String {
        try String(contentsOf: Repository.root.appendingPathComponent(path), encoding: .utf8)
    }

    /// The types declared under Sources/ as conforming to `Service` (`final class X: Service`,
    /// `struct X<…>: Service`, `extension X: Sendable, Service`), with the file of each.
    static func serviceTypes() throws -> [String: String] {
        let declaration = try Regex(#"(?m)^[ \t]*(?:(?:package|public|internal|fileprivate|private|final)\s+)*(?:class|struct|actor|enum|extension)\s+(\w+)(?:<[^>{]*>)?\s*:\s*([^{]+)\{"#)
        var found: [String: String] = [:]
        let root = Repository.root.appendingPathComponent("Sources")
        let files = try #require(FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil))
        for case let file as URL in files where file.pathExtension == "swift" {
            let text = try String(contentsOf: file, encoding: .utf8)
            for match in text.matches(of: declaration) {
                guard let name = match.output[1].substring, let conformances = match.output[2].substring else { continue }
                let protocols = conformances.split(separator: "where").first?.split(separator: ",") ?? []
                let names = protocols.map { $0.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: ".").last.map(String.init) ?? "" }
                if names.contains("Service") { found[String(name)] = file.path.replacingOccurrences(of: Repository.root.path + "/", with: "") }
            }
        }
        return found
    }

    /// Every target of Package.swift: the modules and their test targets.
    static func targets() throws -> [String] {
        let target = try Regex(#"\.(?:target|executableTarget|testTarget)\(\s*name:\s*"(\w+)""#)
        return try read("Package.swift").matches(of: target).compactMap { $0.output[1].substring.map(String.init) }
    }

    @Test("docs/architecture.md names every module, every Service type under Sources/ and every lane of Lane.all")
    func architectureNamesTheCode() throws {
        let text = try Self.read(Self.page)
        let services = try Self.serviceTypes()
        // The scan itself still finds what it is for: the loops of each side.
        #expect(["EffectWorker", "Deliverer", "GroupCommitter", "AppleKeyCache"].allSatisfy { services[$0] != nil }, "\(services.keys.sorted())")
        for (name, file) in services.sorted(by: { $0.key < $1.key }) {
            #expect(text.contains("`\(name)`"), "\(Self.page) does not name the loop `\(name)` (a Service, \(file))")
        }
        #expect(!Lane.all.isEmpty)
        for lane in Lane.all {
            #expect(text.contains("`\(lane.rawValue)`"), "\(Self.page) does not name the lane `\(lane.rawValue)` (Lane.all)")
        }
        let targets = try Self.targets()
        #expect(targets.contains("SiwaDomain") && targets.contains("SiwaCLITests"), "\(targets)")
        for target in targets {
            #expect(text.contains("`\(target)`"), "\(Self.page) does not name the module `\(target)` (Package.swift)")
        }
    }

    /// The anchors GitHub gives a document's headings: lower-cased, punctuation but `-` and `_`
    /// dropped, spaces as `-`, a repeated heading suffixed `-1`, `-2`, …; headings inside fenced
    /// code are not headings.
    static func anchors(_ document: String) -> Set<String> {
        var anchors: Set<String> = []
        var seen: [String: Int] = [:]
        var fenced = false
        for line in document.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") { fenced.toggle() }
            guard !fenced, line.hasPrefix("#") else { continue }
            let title = line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces)
            let slug = String(
                title.lowercased().compactMap { character -> Character? in
                    if character == " " { return "-" }
                    return character.isLetter || character.isNumber || character == "-" || character == "_" ? character : nil
                })
            let count = seen[slug, default: 0]
            seen[slug] = count + 1
            anchors.insert(count == 0 ? slug : "\(slug)-\(count)")
        }
        return anchors
    }

    @Test("Every relative link of README.md, BENCHMARKS.md, docs/*.md and deploy/README.md leads to a file, and its #anchor to a heading there")
    func linksResolve() throws {
        let docs = try FileManager.default.contentsOfDirectory(atPath: Repository.root.appendingPathComponent("docs").path)
            .filter { $0.hasSuffix(".md") }.map { "docs/\($0)" }
        let documents = ["README.md", "BENCHMARKS.md", "deploy/README.md"] + docs.sorted()
        #expect(docs.contains(Self.page) && docs.contains("docs/reference.md"))
        let link = try Regex(#"\]\(([^)\s]+)\)"#)
        var checked = 0
        for document in documents {
            let text = try Self.read(document)
            let folder = document.lastIndex(of: "/").map { String(document[..<$0]) } ?? ""
            var fenced = false
            for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
                if line.hasPrefix("```") { fenced.toggle() }
                guard !fenced else { continue }
                for match in line.matches(of: link) {
                    guard let target = match.output[1].substring.map(String.init), !target.contains("://"), !target.hasPrefix("mailto:") else { continue }
                    let parts = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                    let path = parts[0].isEmpty ? document : (folder.isEmpty ? parts[0] : "\(folder)/\(parts[0])")
                    let resolved = Repository.root.appendingPathComponent(path).standardizedFileURL
                    checked += 1
                    guard FileManager.default.fileExists(atPath: resolved.path) else {
                        Issue.record("\(document): the link \(target) leads to no file (\(resolved.path))")
                        continue
                    }
                    if parts.count == 2, resolved.pathExtension == "md" {
                        let anchors = Self.anchors(try String(contentsOf: resolved, encoding: .utf8))
                        #expect(anchors.contains(parts[1]), "\(document): the link \(target) names no heading of \(path)")
                    }
                }
            }
        }
        #expect(checked > 20, "found only \(checked) links: is the pattern right?")
    }
}
