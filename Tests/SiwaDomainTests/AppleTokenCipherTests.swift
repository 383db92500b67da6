import Foundation
import SiwaDomain
import Testing

@Suite("Apple refresh tokens at rest (AES-GCM keyring)", .timeLimit(.minutes(10)))
struct AppleTokenCipherTests {
    let owner = AppleTokenOwner(aud: "com.example.app", sub: "001234.abcdef.1234")
    /// Shaped like Apple's: dots, dashes, underscores.
    let token = "r1a2b3c4d5e6f7.0.srxz.Zm9v-YmFy_YmF6.abc"

    @Test("a token round-trips, and the stored text is v1.<key id>.<base64url> without the token in it")
    func roundTrip() throws {
        let cipher = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let stored = cipher.encrypt(token, owner: owner)
        let parts = stored.split(separator: ".")
        #expect(parts.count == 3 && parts[0] == "v1" && parts[1] == Substring(cipher.currentKeyID))
        #expect(cipher.currentKeyID.count == 8 && cipher.currentKeyID.allSatisfy(\.isHexDigit))
        #expect(!stored.contains(token) && !stored.contains("srxz"))
        #expect(try cipher.decrypt(stored, owner: owner) == token)
        #expect(cipher.encrypt(token, owner: owner) != stored, "a fresh nonce each time")
        #expect(!cipher.needsReencryption(stored))
    }

    @Test("the first key encrypts, every key decrypts, and what an old key encrypted needs re-encryption")
    func rotation() throws {
        let (old, new) = (AppleTokenCipher.generateKey(), AppleTokenCipher.generateKey())
        let before = try AppleTokenCipher(keys: old)
        let during = try AppleTokenCipher(keys: "\(new) \(old)")
        let after = try AppleTokenCipher(keys: new)
        let storedBefore = before.encrypt(token, owner: owner)
        #expect(during.currentKeyID == after.currentKeyID && during.keyIDs == [after.currentKeyID, before.currentKeyID])
        #expect(AppleTokenCipher.keyID(of: during.encrypt(token, owner: owner)) == after.currentKeyID)
        #expect(try during.decrypt(storedBefore, owner: owner) == token)
        #expect(during.needsReencryption(storedBefore))
        let reencrypted = try #require(try during.reencrypt(storedBefore, owner: owner))
        #expect(!during.needsReencryption(reencrypted))
        #expect(try during.reencrypt(reencrypted, owner: owner) == nil)
        // Once re-encrypted, the old key can go.
        #expect(try after.decrypt(reencrypted, owner: owner) == token)
        #expect(throws: AppleTokenCipher.DecryptionError.unknownKey(id: before.currentKeyID)) {
            try after.decrypt(storedBefore, owner: owner)
        }
    }

    @Test("a ciphertext under a key not in the keyring names that key")
    func unknownKey() throws {
        let other = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let cipher = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let stored = other.encrypt(token, owner: owner)
        #expect(throws: AppleTokenCipher.DecryptionError.unknownKey(id: other.currentKeyID)) { try cipher.decrypt(stored, owner: owner) }
        #expect(cipher.needsReencryption(stored))
    }

    @Test("any altered byte of the sealed part fails to authenticate (nonce, ciphertext, tag)")
    func tampered() throws {
        let cipher = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let stored = cipher.encrypt(token, owner: owner)
        let prefix = "v1.\(cipher.currentKeyID)."
        let sealed = try #require(Base64URL.decode(stored.dropFirst(prefix.count)))
        for index in [0, 11, 12, sealed.count / 2, sealed.count - 1] {
            var altered = sealed
            altered[altered.startIndex + index] ^= 0x01
            #expect(throws: AppleTokenCipher.DecryptionError.unauthentic(keyID: cipher.currentKeyID), "byte \(index)") {
                try cipher.decrypt(prefix + Base64URL.encode(altered), owner: owner)
            }
        }
        #expect(throws: AppleTokenCipher.DecryptionError.unauthentic(keyID: cipher.currentKeyID), "truncated") {
            try cipher.decrypt(prefix + Base64URL.encode(sealed.dropLast()), owner: owner)
        }
    }

    @Test("a ciphertext copied to another account's row does not decrypt there (aud and sub are bound)")
    func boundToOwner() throws {
        let cipher = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        let stored = cipher.encrypt(token, owner: owner)
        for other in [
            AppleTokenOwner(aud: owner.aud, sub: "001234.abcdef.1235"), AppleTokenOwner(aud: "com.example.other", sub: owner.sub),
            // The same bytes split differently: length prefixes keep these apart.
            AppleTokenOwner(aud: "com.example.app001234", sub: ".abcdef.1234"),
        ] {
            #expect(throws: AppleTokenCipher.DecryptionError.unauthentic(keyID: cipher.currentKeyID), "\(other)") {
                try cipher.decrypt(stored, owner: other)
            }
        }
    }

    @Test("what is not one of our ciphertexts is malformed", arguments: [
        "", "v1", "v1..", "v2.00000000.AAAA", "plain-refresh-token", "v1.00000000.not base64", "v1.00000000.AAAA", "v1.a.b.c",
    ])
    func malformed(stored: String) throws {
        let cipher = try AppleTokenCipher(keys: AppleTokenCipher.generateKey())
        #expect(throws: AppleTokenCipher.DecryptionError.malformed) { try cipher.decrypt(stored, owner: owner) }
        #expect(cipher.needsReencryption(stored))
    }

    @Test("a malformed keyring is refused naming the key's position and never showing it")
    func malformedKeys() throws {
        let good = AppleTokenCipher.generateKey()
        let short = Data(repeating: 7, count: 16).base64EncodedString()
        let long = Data(repeating: 9, count: 33).base64EncodedString()
        let cases: [(String, AppleTokenCipher.KeyError, String, secret: String?)] = [
            ("", .missing, "no key given", nil),
            ("  \n", .missing, "no key given", nil),
            ("\(good) not*base64!", .malformed(position: 2, decodedBytes: nil), "key 2 is not base64", "not*base64!"),
            (short, .malformed(position: 1, decodedBytes: 16), "key 1 decodes to 16 bytes", short),
            ("\(good) \(long)", .malformed(position: 2, decodedBytes: 33), "key 2 decodes to 33 bytes", long),
            ("\(good) \(AppleTokenCipher.generateKey()) \(good)", .duplicate(position: 3, sameAs: 1), "key 3 is the same key as key 1", good),
        ]
        for (keys, expected, message, secret) in cases {
            #expect(throws: expected) { try AppleTokenCipher(keys: keys) }
            do {
                _ = try AppleTokenCipher(keys: keys)
            } catch {
                #expect("\(error)".contains(message), "\(error)")
                for shown in ["\(error)", String(reflecting: error)] {
                    #expect(!shown.contains(good), "never shows a key")
                    if let secret { #expect(!shown.contains(secret), "never shows the key") }
                }
            }
        }
    }

    @Test("generated keys are 32 random bytes and each works on its own")
    func generated() throws {
        let keys = (0..<8).map { _ in AppleTokenCipher.generateKey() }
        #expect(Set(keys).count == 8)
        for key in keys {
            #expect(Data(base64Encoded: key)?.count == 32)
            let cipher = try AppleTokenCipher(keys: key)
            #expect(try cipher.decrypt(cipher.encrypt(token, owner: owner), owner: owner) == token)
        }
        #expect(Set(try keys.map { try AppleTokenCipher(keys: $0).currentKeyID }).count == 8)
    }
}
