import Crypto
import Foundation

/// Whose token a ciphertext holds: its account, `aud` (the client ID) and `sub`.
package struct AppleTokenOwner: Sendable, Hashable {
    package var aud: String
    package var sub: String

    package init(aud: String, sub: String) {
        self.aud = aud
        self.sub = sub
    }

    /// The AES-GCM additional data: each part length-prefixed, so no two owners share it.
    var authenticatedData: [UInt8] {
        var bytes = Array("siwa-apple-token-v1".utf8)
        for part in [aud, sub] {
            withUnsafeBytes(of: UInt32(part.utf8.count).bigEndian) { bytes.append(contentsOf: $0) }
            bytes.append(contentsOf: part.utf8)
        }
        return bytes
    }
}

/// Apple refresh tokens at rest: AES-256-GCM under a keyring (`SIWA_APPLE_TOKEN_KEYS`). The
/// first key encrypts, every key decrypts, and each ciphertext names its key, so a key is
/// rotated by putting a new one first, re-encrypting (`needsReencryption`), then dropping the old.
/// The ciphertext is bound to its owner (additional data): copied to another account's row, it
/// does not decrypt. Stored as text: `v1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>`.
package struct AppleTokenCipher: Sendable {
    /// The keyring's value is refused; never shows a key, only its position.
    package enum KeyError: Error, Sendable, Equatable, CustomStringConvertible {
        case missing
        /// Not base64 of exactly 32 bytes (`decodedBytes` nil: not base64 at all).
        case malformed(position: Int, decodedBytes: Int?)
        case duplicate(position: Int, sameAs: Int)

        package var description: String {
            switch self {
            case .missing:
                "no key given: give the base64 of 32 random bytes (`openssl rand -base64 32`)"
            case .malformed(let position, nil):
                "key \(position) is not base64: each key is the base64 of 32 random bytes"
            case .malformed(let position, let count?):
                "key \(position) decodes to \(count) bytes: each key is the base64 of exactly 32 random bytes"
            case .duplicate(let position, let first):
                "key \(position) is the same key as key \(first)"
            }
        }
    }

    /// A stored ciphertext that does not decrypt.
    package enum DecryptionError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Not `v1.<key id>.<base64url>` of a plausible length.
        case malformed
        /// Encrypted under a key no longer in the keyring.
        case unknownKey(id: String)
        /// Altered, or bound to another owner.
        case unauthentic(keyID: String)

        package var description: String {
            switch self {
            case .malformed: "not an encrypted token (expected v1.<key id>.<base64url>)"
            case .unknownKey(let id): "encrypted under key \(id), which is not in the keyring"
            case .unauthentic(let id): "does not authenticate under key \(id): altered, or stored for another account"
            }
        }
    }

    private struct Key: Sendable {
        var id: String
        var key: SymmetricKey
    }

    private static let version = "v1"
    /// 12-byte nonce + 16-byte tag.
    private static let overhead = 28
    /// Refresh tokens are a few hundred bytes; anything far past that is not ours.
    private static let maximumStoredLength = 8192

    private let keys: [Key]

    /// `keys`: space-separated base64 of 32 random bytes each, as `SIWA_APPLE_TOKEN_KEYS` holds them.
    package init(keys text: String) throws(KeyError) {
        let parts = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
        guard !parts.isEmpty else { throw .missing }
        var keys: [Key] = []
        for (index, part) in parts.enumerated() {
            guard let bytes = Data(base64Encoded: String(part)) else { throw .malformed(position: index + 1, decodedBytes: nil) }
            guard bytes.count == 32 else { throw .malformed(position: index + 1, decodedBytes: bytes.count) }
            let id = Self.keyID(bytes)
            if let first = keys.firstIndex(where: { $0.id == id }) { throw .duplicate(position: index + 1, sameAs: first + 1) }
            keys.append(Key(id: id, key: SymmetricKey(data: bytes)))
        }
        self.keys = keys
    }

    /// A new key for the keyring: base64 of 32 random bytes.
    package static func generateKey() -> String {
        SymmetricKey(size: .bits256).withUnsafeBytes { Data($0).base64EncodedString() }
    }

    /// 8 hex digits of a domain-separated SHA-256 of the key: names it without revealing it.
    private static func keyID(_ key: Data) -> String {
        var input = Data("siwa-apple-token-key-id".utf8)
        input.append(key)
        return SHA256.hash(data: input).prefix(4).map { String(format: "%02x", $0) }.joined()
    }

    /// The id of the key that encrypts (the first).
    package var currentKeyID: String { keys[0].id }
    /// Every key's id, in keyring order.
    package var keyIDs: [String] { keys.map(\.id) }

    package func encrypt(_ token: String, owner: AppleTokenOwner) -> String {
        let key = keys[0]
        // Sealing fails only for a key or nonce of the wrong size; ours are fixed at 32 and 12 bytes.
        let box = try! AES.GCM.seal(Data(token.utf8), using: key.key, authenticating: owner.authenticatedData)
        return "\(Self.version).\(key.id).\(Base64URL.encode(box.combined!))"
    }

    package func decrypt(_ stored: String, owner: AppleTokenOwner) throws(DecryptionError) -> String {
        guard stored.utf8.count <= Self.maximumStoredLength else { throw .malformed }
        let parts = stored.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == Self.version, let sealed = Base64URL.decode(parts[2]), sealed.count >= Self.overhead else {
            throw .malformed
        }
        let id = String(parts[1])
        guard let key = keys.first(where: { $0.id == id }) else { throw .unknownKey(id: UntrustedText.bounded(id, limit: 16)) }
        do {
            let box = try AES.GCM.SealedBox(combined: sealed)
            let plain = try AES.GCM.open(box, using: key.key, authenticating: owner.authenticatedData)
            guard let token = String(bytes: plain, encoding: .utf8) else { throw DecryptionError.unauthentic(keyID: id) }
            return token
        } catch {
            throw .unauthentic(keyID: id)
        }
    }

    /// The key id a stored value names (nil when it is not one of ours).
    package static func keyID(of stored: String) -> String? {
        let parts = stored.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == version else { return nil }
        return String(parts[1])
    }

    /// True unless `stored` is under the first key: what a re-encryption round picks up.
    package func needsReencryption(_ stored: String) -> Bool {
        Self.keyID(of: stored) != currentKeyID
    }

    /// `stored` under the first key, or nil when it already is.
    package func reencrypt(_ stored: String, owner: AppleTokenOwner) throws(DecryptionError) -> String? {
        guard needsReencryption(stored) else { return nil }
        return encrypt(try decrypt(stored, owner: owner), owner: owner)
    }
}
