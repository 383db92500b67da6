import Crypto
import Foundation

/// What a backend API token may do. `admin` grants every scope.
package enum APIScope: String, Sendable, CaseIterable, Hashable {
    case sessionsWrite = "sessions:write"
    case sessionsRead = "sessions:read"
    case accountsRead = "accounts:read"
    case accountsErase = "accounts:erase"
    case notificationsRead = "notifications:read"
    case alertsRead = "alerts:read"
    /// The suppression feed (`GET /v1/suppressions`): addresses, to stop mailing them.
    case suppressionsRead = "suppressions:read"
    case admin
}

extension Set<APIScope> {
    /// True when these scopes allow `needed`.
    package func allows(_ needed: APIScope) -> Bool { contains(.admin) || contains(needed) }
}

/// Bearer tokens: `siwa_` and 43 base64url characters (256 random bits). Only their SHA-256 is
/// stored; a token is shown once, when it is created.
package enum APIToken {
    package static let prefix = "siwa_"

    package static func generate() -> String {
        prefix + Base64URL.encode(SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
    }

    /// The stored form. The token's shape is checked first, so junk never reaches the database.
    package static func hash(_ token: String) -> [UInt8]? {
        guard token.hasPrefix(prefix), token.utf8.count == prefix.utf8.count + 43 else { return nil }
        return Array(SHA256.hash(data: Data(token.utf8)))
    }
}
