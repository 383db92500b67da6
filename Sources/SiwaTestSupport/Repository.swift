import Foundation

/// The checkout's files the tests read: deploy/, docs, fixtures.
package enum Repository {
    package static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    package static let deploy = root.appendingPathComponent("deploy")
    /// Tokens Apple signed, and the keys that verify them (see its README).
    package static let appleFixtures = root.appendingPathComponent("Tests/fixtures/apple-real")
}
