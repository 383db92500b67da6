import Foundation
import SiwaDomain

/// Real Apple-signed tokens from `../shared/fixtures/apple-real/` (beside the repository).
enum AppleFixtures {
    static let directory: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }  // Tests/SiwaDomainTests/Fixtures.swift → repo
        return url.deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple-real")
    }()

    static func json(_ name: String) throws -> JSONValue {
        let data = try Data(contentsOf: directory.appendingPathComponent(name))
        guard let value = JSONValue.parse(data) else { throw FixtureError.unreadable(name) }
        return value
    }

    static func jws(_ name: String) throws -> String {
        guard let jws = try json(name)["jws"]?.stringValue else { throw FixtureError.unreadable(name) }
        return jws
    }

    static func keys() throws -> AppleKeySet {
        try AppleKeySet.parse(Data(contentsOf: directory.appendingPathComponent("jwks.json")))
    }

    /// The time a fixture was valid: its iat + 1 second.
    static func validTime(_ jws: String) throws -> Date {
        let token = try CompactJWS(jws)
        guard let iat = JSONValue.parse(token.payload)?["iat"]?.numberValue else { throw FixtureError.unreadable("iat") }
        return Date(timeIntervalSince1970: iat + 1)
    }

    enum FixtureError: Error { case unreadable(String) }
}
