import Crypto
import Foundation
import SiwaDomain

/// The stand-in's `transfer_sub`s, kept nowhere: each is the transfer itself (sender team, target
/// team, sub) sealed with AES-GCM under a nonce that is an HMAC of it (a synthetic IV), so the
/// same transfer always gives the same `transfer_sub` and only this stand-in can open one. The
/// keys come from a seed (by default the id_token key of `--keys`): same seed, same answers.
package struct TransferSubs: Sendable {
    package struct Transfer: Sendable, Equatable {
        package var sender: String
        package var target: String
        package var sub: String
    }

    /// The longest `sub` taken, so every `transfer_sub` fits `AppleTransferSub.maximumLength`.
    package static let maximumSubLength = 128
    private static let prefix = "st1."

    private let sealing: SymmetricKey
    private let nonces: SymmetricKey
    private let identities: SymmetricKey

    package init(seed: some DataProtocol) {
        let material = SymmetricKey(data: Data(seed))
        func key(_ purpose: String) -> SymmetricKey {
            HKDF<SHA256>.deriveKey(inputKeyMaterial: material, salt: Data("siwa-standin-transfer".utf8), info: Data(purpose.utf8), outputByteCount: 32)
        }
        (sealing, nonces, identities) = (key("seal"), key("nonce"), key("identity"))
    }

    package func seal(_ transfer: Transfer) -> String {
        let plaintext = Self.plaintext(transfer)
        let nonce = try! AES.GCM.Nonce(data: Data(HMAC<SHA256>.authenticationCode(for: plaintext, using: nonces).prefix(12)))
        // Sealing with a 32-byte key and a 12-byte nonce cannot fail.
        let box = try! AES.GCM.seal(plaintext, using: sealing, nonce: nonce)
        return Self.prefix + Base64URL.encode(box.combined!)
    }

    /// The transfer a `transfer_sub` of this stand-in stands for; nil for anything else.
    package func open(_ transferSub: String) -> Transfer? {
        guard transferSub.hasPrefix(Self.prefix), let combined = Base64URL.decode(String(transferSub.dropFirst(Self.prefix.count))),
            let box = try? AES.GCM.SealedBox(combined: combined), let plaintext = try? AES.GCM.open(box, using: sealing),
            let text = String(data: plaintext, encoding: .utf8)
        else { return nil }
        let parts = text.split(separator: "\n", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        return Transfer(sender: String(parts[0]), target: String(parts[1]), sub: String(parts[2]))
    }

    /// The user's `sub` in the target team, shaped as Apple's: `001234.<32 hex>.0123`.
    package func recipientSub(_ transfer: Transfer) -> String {
        let bytes = Array(HMAC<SHA256>.authenticationCode(for: Data("sub\n".utf8) + Self.plaintext(transfer), using: identities))
        let head = (Int(bytes[0]) << 16 | Int(bytes[1]) << 8 | Int(bytes[2])) % 1_000_000
        let tail = (Int(bytes[19]) << 8 | Int(bytes[20])) % 10_000
        let hex = bytes[3..<19].map { String(format: "%02x", $0) }.joined()
        return String(format: "%06d", head) + "." + hex + "." + String(format: "%04d", tail)
    }

    /// A private-relay user's new address for the target team.
    package func relayEmail(_ transfer: Transfer) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789")
        let bytes = HMAC<SHA256>.authenticationCode(for: Data("email\n".utf8) + Self.plaintext(transfer), using: identities)
        return String(bytes.prefix(10).map { alphabet[Int($0) % alphabet.count] }) + "@privaterelay.appleid.com"
    }

    private static func plaintext(_ transfer: Transfer) -> Data {
        Data("\(transfer.sender)\n\(transfer.target)\n\(transfer.sub)".utf8)
    }
}
