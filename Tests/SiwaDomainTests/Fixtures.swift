import Foundation
import SiwaDomain

/// Real Apple-signed tokens from `Tests/fixtures/apple-real/` (its README says where each came from).
enum AppleFixtures {
    static let directory: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<2 { url.deleteLastPathComponent() }  // Tests/SiwaDomainTests/Fixtures.swift → Tests
        return url.appendingPathComponent("fixtures/apple-real")
    }()

    static func json(_ name: String) throws -> JSONValue {
        let data = try Data(contentsOf: file(name))
        guard let value = JSONValue.parse(data) else { throw FixtureError.unreadable(name) }
        return value
    }

    static func jws(_ name: String) throws -> String {
        guard let jws = try json(name)["jws"]?.stringValue else { throw FixtureError.unreadable(name) }
        return jws
    }

    static func keys() throws -> AppleKeySet {
        try AppleKeySet.parse(Data(contentsOf: file("jwks.json")))
    }

    /// Missing, the error says where the fixtures were looked for.
    static func file(_ name: String) throws -> URL {
        let file = directory.appendingPathComponent(name)
        guard FileManager.default.fileExists(atPath: file.path) else { throw FixtureError.missing(file.path) }
        return file
    }

    /// The time a fixture was valid: its iat + 1 second.
    static func validTime(_ jws: String) throws -> Date {
        let token = try CompactJWS(jws)
        guard let iat = JSONValue.parse(token.payload)?["iat"]?.numberValue else { throw FixtureError.unreadable("iat") }
        return Date(timeIntervalSince1970: iat + 1)
    }

    enum FixtureError: Error, CustomStringConvertible {
        case unreadable(String)
        case missing(String)

        var description: String {
            switch self {
            case .unreadable(let name): "fixture \(name) is not what the tests expect"
            case .missing(let path): "no Apple fixture at \(path): Tests/fixtures/apple-real/ is part of the repository"
            }
        }
    }
}
