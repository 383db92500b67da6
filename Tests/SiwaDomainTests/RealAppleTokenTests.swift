import Foundation
import SiwaDomain
import Testing

@Suite("Real Apple-signed notifications", .timeLimit(.minutes(10)))
struct RealAppleTokenTests {
    @Test("A real consent-revoked notification verifies at its time and decodes with millisecond event_time")
    func consentRevoked() throws {
        let jws = try AppleFixtures.jws("consent-revoked.json")
        let verifier = NotificationVerifier(audiences: ["com.fullqueuedeveloper.FQAuthSampleiOSApp"])
        let verified = try verifier.verify(jws, keys: try AppleFixtures.keys(), now: try AppleFixtures.validTime(jws))
        #expect(verified.jti == "0PqlxYF011e15IMQOxEsFQ")
        #expect(verified.aud == "com.fullqueuedeveloper.FQAuthSampleiOSApp")
        #expect(verified.kid == "fh6Bs8C")
        #expect(verified.jtiDerived == false)
        let event = try #require(verified.decoding.event)
        #expect(verified.decoding == .event(event))
        #expect(event.type == .consentRevoked)
        #expect(event.sub == "002024.1951936c61fa47debb2b076e6896ccc1.1949")
        #expect(event.eventTimeMillis == 1_670_016_125_295)
        #expect(event.email == nil)
    }

    @Test("A real email-disabled notification carries the relay address and is_private_email as a string")
    func emailDisabled() throws {
        let jws = try AppleFixtures.jws("email-disabled.json")
        let verifier = NotificationVerifier(audiences: ["com.gameroasters.stack4"])
        let verified = try verifier.verify(jws, keys: try AppleFixtures.keys(), now: try AppleFixtures.validTime(jws))
        let event = try #require(verified.decoding.event)
        #expect(event.type == .emailDisabled)
        #expect(event.email == "zdfu7jtuus@privaterelay.appleid.com")
        #expect(event.isPrivateEmail == true)
        #expect(event.eventTimeMillis == 1_630_085_403_648)
    }

    @Test("The consent-revoked POST body Apple sent holds the same token")
    func httpBody() throws {
        let fixture = try AppleFixtures.json("consent-revoked.json")
        let body = try #require(fixture["http_body"]?.stringValue)
        #expect(JSONValue.parse(Data(body.utf8))?["payload"]?.stringValue == fixture["jws"]?.stringValue)
    }

    @Test("The real tokens are refused a day after they were issued: expired")
    func expiredAfterADay() throws {
        let jws = try AppleFixtures.jws("consent-revoked.json")
        let verifier = NotificationVerifier(audiences: ["com.fullqueuedeveloper.FQAuthSampleiOSApp"])
        let later = try AppleFixtures.validTime(jws).addingTimeInterval(86_400 + 120)
        #expect(throws: VerificationError.self) { try verifier.verify(jws, keys: try AppleFixtures.keys(), now: later) }
        do {
            _ = try verifier.verify(jws, keys: try AppleFixtures.keys(), now: later)
        } catch {
            #expect((error as? VerificationError)?.reason == .expired)
        }
    }

    @Test("Changing any one byte of a real token makes it fail", arguments: ["consent-revoked.json", "email-disabled.json"])
    func oneByteChange(fixture: String) throws {
        let jws = try AppleFixtures.jws(fixture)
        let keys = try AppleFixtures.keys()
        let now = try AppleFixtures.validTime(jws)
        let audiences: Set<String> = ["com.fullqueuedeveloper.FQAuthSampleiOSApp", "com.gameroasters.stack4"]
        let verifier = NotificationVerifier(audiences: audiences)
        #expect(throws: Never.self) { try verifier.verify(jws, keys: keys, now: now) }
        let characters = Array(jws)
        let dots = characters.indices.filter { characters[$0] == "." }
        // One position in the header, several in the payload, several in the signature.
        let positions = [5, dots[0] + 10, dots[0] + 40, dots[1] - 3, dots[1] + 1, dots[1] + 100, characters.count - 2]
        for position in positions {
            var mutated = characters
            mutated[position] = mutated[position] == "A" ? "B" : "A"
            let result = Result { try verifier.verify(String(mutated), keys: keys, now: now) }
            guard case .failure(let error) = result else {
                Issue.record("a one-byte change at \(position) still verified")
                continue
            }
            let reason = (error as? VerificationError)?.reason
            #expect(reason != nil, "position \(position): \(error)")
        }
    }

    @Test("A real identity token passes Apple's signature but is refused as not a notification (no events, a top-level sub)")
    func identityToken() throws {
        let jws = try AppleFixtures.jws("identity-token.json")
        let verifier = NotificationVerifier(audiences: ["de.lunaone.sign-in-with-apple-example"])
        do {
            _ = try verifier.verify(jws, keys: try AppleFixtures.keys(), now: try AppleFixtures.validTime(jws))
            Issue.record("an identity token was accepted as a notification")
        } catch let error as VerificationError {
            #expect(error.reason == .malformedRequest)
            #expect(error.message.contains("identity token"))
        }
        // Its signature is Apple's: with another audience it fails on aud, after the signature.
        let other = NotificationVerifier(audiences: ["com.example.other"])
        #expect(throws: VerificationError.invalid(.wrongAudience, "aud de.lunaone.sign-in-with-apple-example is not a configured bundle ID (SIWA_APPLE_BUNDLE_IDS)")) {
            try other.verify(jws, keys: try AppleFixtures.keys(), now: try AppleFixtures.validTime(jws))
        }
    }

    @Test("A token whose kid is not in the set is unknown_key, never checked against another key")
    func noDefaultKeyFallback() throws {
        let jws = try AppleFixtures.jws("consent-revoked.json")
        let all = try AppleFixtures.keys()
        let others = AppleKeySet(keys: all.keys.values.filter { $0.kid != "fh6Bs8C" }, document: Data())
        let verifier = NotificationVerifier(audiences: ["com.fullqueuedeveloper.FQAuthSampleiOSApp"])
        do {
            _ = try verifier.verify(jws, keys: others, now: try AppleFixtures.validTime(jws))
            Issue.record("verified without its key")
        } catch {
            #expect((error as? VerificationError)?.reason == .unknownKey)
        }
    }

    @Test("A real token verified under another kid's key is bad_signature")
    func wrongKey() throws {
        let jws = try AppleFixtures.jws("consent-revoked.json")
        let keys = try AppleFixtures.keys()
        let token = try CompactJWS(jws)
        let verifier = NotificationVerifier(audiences: ["com.fullqueuedeveloper.FQAuthSampleiOSApp"])
        let other = try #require(keys["eXaunmL"])
        #expect(throws: VerificationError.invalid(.badSignature, "the signature does not match Apple key eXaunmL")) {
            try verifier.verify(token, key: other, now: try AppleFixtures.validTime(jws))
        }
    }
}
