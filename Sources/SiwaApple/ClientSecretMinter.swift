import Crypto
import Foundation
import SiwaDomain
import Synchronization

/// Client secrets for Apple's auth endpoints: ES256 JWTs signed with the team's `.p8` key, one
/// per client ID, cached and renewed a margin before `exp` (`ClientSecretPolicy`). The key is
/// read once; neither it nor a secret is ever shown (a `Secret` prints its claims only).
package final class ClientSecretMinter: Sendable {
    /// The team's private key and its key ID.
    package struct SigningKey: Sendable {
        package enum LoadError: Error, Sendable, Equatable, CustomStringConvertible {
            case unreadable(path: String, reason: String)
            case notAP256Key(path: String)
            case invalidKeyID(String)

            package var description: String {
                switch self {
                case .unreadable(let path, let reason): "cannot read the Apple private key file \(path): \(reason)"
                case .notAP256Key(let path):
                    "\(path) is not a P-256 private key in PEM (Apple's .p8: -----BEGIN PRIVATE KEY-----)"
                case .invalidKeyID(let id):
                    "the key ID must be 10 characters, A-Z and 0-9 (got \"\(UntrustedText.bounded(id, limit: 32))\")"
                }
            }
        }

        /// A `.p8` is about 250 bytes; a file far larger is not one (and is not read whole).
        static let maximumFileSize = 16 * 1024

        package let keyID: String
        let privateKey: P256.Signing.PrivateKey

        package init(keyID: String, privateKey: P256.Signing.PrivateKey) throws(LoadError) {
            guard ClientSecretPolicy.isAppleIdentifier(keyID) else { throw .invalidKeyID(keyID) }
            self.keyID = keyID
            self.privateKey = privateKey
        }

        /// Reads the `.p8` at `path`. Errors name the path, never the file's content.
        package static func load(path: String, keyID: String) throws(LoadError) -> SigningKey {
            let data: Data
            do {
                let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
                defer { try? handle.close() }
                data = try handle.read(upToCount: maximumFileSize + 1) ?? Data()
            } catch let error as CocoaError where error.code == .fileReadNoSuchFile || error.code == .fileNoSuchFile {
                throw .unreadable(path: path, reason: "no such file")
            } catch let error as CocoaError where error.code == .fileReadNoPermission {
                throw .unreadable(path: path, reason: "permission denied")
            } catch {
                throw .unreadable(path: path, reason: "not a readable file")
            }
            guard data.count <= maximumFileSize else { throw .notAP256Key(path: path) }
            guard let key = try? P256.Signing.PrivateKey(pemRepresentation: String(decoding: data, as: UTF8.self)) else {
                throw .notAP256Key(path: path)
            }
            return try SigningKey(keyID: keyID, privateKey: key)
        }

        package var publicKey: P256.Signing.PublicKey { privateKey.publicKey }
    }

    /// A minted secret: the JWT and its claims. Printing it shows the claims, not the JWT.
    package struct Secret: Sendable, CustomStringConvertible, CustomReflectable {
        package let jwt: String
        package let claims: ClientSecretClaims

        package var description: String { "client secret for \(claims.subject), iat \(claims.issuedAt), exp \(claims.expiresAt)" }
        package var customMirror: Mirror { Mirror(self, children: [:]) }
    }

    package struct SigningFailed: Error, Sendable, CustomStringConvertible {
        package var description: String { "could not sign a client secret with the Apple private key" }
    }

    package let policy: ClientSecretPolicy
    private let key: SigningKey
    private let cache = Mutex<[String: Secret]>([:])

    /// One key signs. Rotating it means restarting with the new one: Apple accepts a team's two
    /// keys at once, so the old secrets stay valid until then.
    package init(policy: ClientSecretPolicy, key: SigningKey) {
        self.policy = policy
        self.key = key
    }

    /// The secret for `clientID` at `now`: the cached one until the policy wants it renewed.
    package func secret(clientID: String, now: Date) throws(SigningFailed) -> Secret {
        try cache.withLock { cache throws(SigningFailed) -> Secret in
            if let cached = cache[clientID], !policy.needsRenewal(cached.claims, now: now) { return cached }
            let minted = try mint(claims: policy.claims(clientID: clientID, now: now))
            cache[clientID] = minted
            return minted
        }
    }

    private func mint(claims: ClientSecretClaims) throws(SigningFailed) -> Secret {
        let header = ClientSecretPolicy.header(keyID: key.keyID)
        let input = Base64URL.encode(Data(header.jsonText.utf8)) + "." + Base64URL.encode(Data(claims.json.jsonText.utf8))
        // JWS ES256 is the raw 64-byte r ‖ s, not DER.
        guard let signature = try? key.privateKey.signature(for: Data(input.utf8)) else { throw SigningFailed() }
        return Secret(jwt: input + "." + Base64URL.encode(signature.rawRepresentation), claims: claims)
    }
}
