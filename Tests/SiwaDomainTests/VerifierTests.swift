import Crypto
import Foundation
import SiwaDomain
import Testing

/// Each verification failure, one attack per test, with a local key standing in for Apple's.
@Suite("Notification verifier", .timeLimit(.minutes(10)))
struct VerifierTests {
    static let signer = try! AppleStyleSigner.generate()
    static let keys = try! AppleKeySet.parse(try! signer.jwksDocument())
    static let aud = "com.example.app"
    static let now = Date(timeIntervalSince1970: 1_760_000_000)
    let verifier = NotificationVerifier(audiences: [aud, "com.example.other"])

    func reason(_ jws: String, at time: Date = now) -> RejectionReason? {
        do {
            _ = try verifier.verify(jws, keys: Self.keys, now: time)
            return nil
        } catch {
            return error.reason
        }
    }

    func claims(_ edit: (inout [String: JSONValue]) -> Void) -> JSONValue {
        var object = AppleStyleSigner.claims(
            aud: Self.aud, type: "consent-revoked", sub: "001.abc.1", eventTime: Self.now, issuedAt: Self.now, jti: "j1"
        ).objectValue!
        edit(&object)
        return .object(object)
    }

    func signed(header: [String: JSONValue]? = nil, _ edit: (inout [String: JSONValue]) -> Void = { _ in }) throws -> String {
        try Self.signer.sign(
            header: .object(header ?? ["kid": .string(Self.signer.kid), "alg": .string("RS256")]), claims: claims(edit))
    }

    @Test("A notification signed like Apple's verifies and decodes")
    func accepts() throws {
        let verified = try verifier.verify(try signed(), keys: Self.keys, now: Self.now)
        #expect(verified.jti == "j1")
        #expect(verified.decoding.event?.type == .consentRevoked)
        #expect(verified.decoding.event?.eventTimeMillis == Int64(Self.now.timeIntervalSince1970) * 1000)
    }

    @Test("alg other than RS256 is unsupported_algorithm, before any key is used", arguments: ["none", "HS256", "RS512", "PS256", "ES256", "rs256"])
    func algorithms(alg: String) throws {
        #expect(reason(try signed(header: ["kid": .string(Self.signer.kid), "alg": .string(alg)])) == .unsupportedAlgorithm)
    }

    @Test("A correctly signed token with a crit header is unsupported_header (RFC 7515 §4.1.11), whatever it lists", arguments: [
        JSONValue.array([.string("b64")]), .array([.string("exp")]), .array([]), .string("b64"),
    ])
    func criticalHeader(crit: JSONValue) throws {
        #expect(reason(try signed(header: ["kid": .string(Self.signer.kid), "alg": .string("RS256"), "crit": crit, "b64": .bool(false)])) == .unsupportedHeader)
    }

    @Test("An unsigned alg=none token with an empty signature is refused as unsupported_algorithm")
    func algNoneEmptySignature() throws {
        let header = Base64URL.encode(Data(#"{"alg":"none","kid":"x"}"#.utf8))
        let payload = Base64URL.encode(Data(claims { _ in }.jsonText.utf8))
        #expect(reason("\(header).\(payload).") == .unsupportedAlgorithm)
    }

    @Test("An HS256 token MACed with the public key text (key confusion) is refused")
    func keyConfusion() throws {
        let header = Base64URL.encode(Data(#"{"alg":"HS256","kid":"\#(Self.signer.kid)"}"#.utf8))
        let payload = Base64URL.encode(Data(claims { _ in }.jsonText.utf8))
        let mac = HMAC<SHA256>.authenticationCode(for: Data("\(header).\(payload)".utf8), using: SymmetricKey(data: try Self.signer.jwksDocument()))
        #expect(reason("\(header).\(payload).\(Base64URL.encode(Data(mac)))") == .unsupportedAlgorithm)
    }

    @Test("No kid, or a kid not in the set, is unknown_key")
    func unknownKid() throws {
        #expect(reason(try signed(header: ["alg": .string("RS256")])) == .unknownKey)
        #expect(reason(try signed(header: ["alg": .string("RS256"), "kid": .string("nope")])) == .unknownKey)
    }

    @Test("A flipped bit, a truncated signature, swapped segments and another key's signature are bad_signature")
    func badSignatures() throws {
        let jws = try signed()
        var parts = jws.split(separator: ".").map(String.init)
        var signature = Base64URL.decode(parts[2])!
        signature[10] ^= 0x01
        #expect(reason([parts[0], parts[1], Base64URL.encode(signature)].joined(separator: ".")) == .badSignature)
        let truncated = Base64URL.encode(Base64URL.decode(parts[2])!.dropLast(10))
        #expect(reason([parts[0], parts[1], truncated].joined(separator: ".")) == .badSignature)
        let other = try signed { $0["jti"] = .string("j2") }.split(separator: ".").map(String.init)
        #expect(reason([parts[0], other[1], parts[2]].joined(separator: ".")) == .badSignature)
        let impostor = try AppleStyleSigner.generate()
        let forged = try impostor.sign(header: .object(["kid": .string(Self.signer.kid), "alg": .string("RS256")]), claims: claims { _ in })
        #expect(reason(forged) == .badSignature)
        parts[2] = ""
        #expect(reason(parts.joined(separator: ".")) == .badSignature)
    }

    @Test("Not three base64url segments, or a header that is not JSON, is malformed")
    func malformed() throws {
        #expect(reason("abc") == .malformedRequest)
        #expect(reason("a.b") == .malformedRequest)
        #expect(reason("a.b.c.d") == .malformedRequest)
        #expect(reason("a$.b.c") == .malformedRequest)
        #expect(reason("\(Base64URL.encode(Data("not json".utf8))).e30.c2ln") == .malformedRequest)
    }

    @Test("Signed claims holding a NUL are malformed: escaped, named as such; raw, not JSON at all")
    func nulInClaims() throws {
        let escaped = try signed { $0["nonce"] = .string("a\u{0}b") }
        do {
            _ = try verifier.verify(escaped, keys: Self.keys, now: Self.now)
            Issue.record("an escaped NUL verified")
        } catch {
            #expect(error.reason == .malformedRequest && error.message.contains("NUL"), "\(error.message)")
        }
        var raw = Data(claims { _ in }.jsonText.dropLast().utf8)  // without its closing brace
        raw += Data(#","n":"a"#.utf8) + [0] + Data(#"b"}"#.utf8)
        let token = try Self.signer.sign(header: .object(["kid": .string(Self.signer.kid), "alg": .string("RS256")]), payload: raw)
        #expect(reason(token) == .malformedRequest)
        #expect(reason(try signed { $0["nonce"] = .string("a b") }) == nil)
    }

    @Test("A token is split at its dots as String.split would: empty segments kept, at most four, the count named")
    func segments() throws {
        for text in ["", ".", "a..b", "é.ü.ß", "a.b.c.d.e", "..."] {
            let split = text.split(separator: ".", maxSplits: 3, omittingEmptySubsequences: false)
            #expect(CompactJWS.segments(text) == split, "\(text)")
        }
        for (text, count) in [("a.b", 2), ("a.b.c.d.e", 4), ("abc", 1)] {
            do {
                _ = try CompactJWS(text)
                Issue.record("\(text) parsed")
            } catch {
                #expect(error.message.hasSuffix("found \(count)"), "\(error.message)")
            }
        }
    }

    @Test("iss other than Apple is wrong_issuer")
    func issuer() throws {
        do {
            let jws = try signed { $0["iss"] = .string("https://evil.example") }
            #expect(reason(jws) == .wrongIssuer)
        }
        do {
            let jws = try signed { $0["iss"] = nil }
            #expect(reason(jws) == .wrongIssuer)
        }
    }

    @Test("aud outside the configured bundle IDs is wrong_audience; one of several configured is accepted")
    func audience() throws {
        do {
            let jws = try signed { $0["aud"] = .string("com.example.typo") }
            #expect(reason(jws) == .wrongAudience)
        }
        do {
            let jws = try signed { $0["aud"] = nil }
            #expect(reason(jws) == .wrongAudience)
        }
        do {
            let jws = try signed { $0["aud"] = .string("com.example.other") }
            #expect(reason(jws) == nil)
        }
        do {
            let jws = try signed { $0["aud"] = .array([.string("x"), .string(Self.aud)]) }
            #expect(reason(jws) == nil)
        }
    }

    @Test("exp in the past beyond the skew is expired; iat in the future beyond the skew is not_yet_valid; within the skew both pass")
    func times() throws {
        let jws = try signed()
        #expect(reason(jws, at: Self.now.addingTimeInterval(86_400 + 61)) == .expired)
        #expect(reason(jws, at: Self.now.addingTimeInterval(86_400 + 59)) == nil)
        #expect(reason(jws, at: Self.now.addingTimeInterval(-61)) == .notYetValid)
        #expect(reason(jws, at: Self.now.addingTimeInterval(-59)) == nil)
        do {
            let jws = try signed { $0["nbf"] = .number(Self.now.timeIntervalSince1970 + 600) }
            #expect(reason(jws) == .notYetValid)
        }
    }

    @Test("A non-canonical base64url spelling of a valid signature is refused (one spelling per token)")
    func canonicalBase64() throws {
        let jws = try signed()
        let last = jws.last!
        // 256-byte signatures leave 4 unused bits in the last character: flipping one keeps the bytes.
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let index = alphabet.firstIndex(of: last)!
        let sibling = alphabet[index ^ 1]
        #expect(reason(String(jws.dropLast()) + String(sibling)) == .malformedRequest)
    }

    @Test("Out-of-range or non-numeric times are refused or ignored, never a crash")
    func extremeNumbers() throws {
        for value: JSONValue in [.number(-1e300), .number(1e300), .number(-5), .string("soon")] {
            do {
                let jws = try signed { $0["iat"] = value }
                #expect(reason(jws) == .malformedRequest)
            }
            do {
                let jws = try signed { $0["exp"] = value }
                #expect(reason(jws) == .malformedRequest)
            }
        }
        let huge = try verifier.verify(
            try signed { $0["events"] = .string(#"{"type":"consent-revoked","sub":"s","event_time":1e300}"#) }, keys: Self.keys, now: Self.now)
        #expect(huge.decoding.event?.eventTimeMillis == Int64(Self.now.timeIntervalSince1970) * 1000)
    }

    @Test("A missing exp is refused with its own reason (Apple's tokens always carry one)")
    func missingExp() throws {
        let jws = try signed { $0["exp"] = nil }
        #expect(reason(jws) == .missingExpiry)
    }

    @Test("A missing jti uses the SHA-256 of the payload segment")
    func missingJTI() throws {
        let jws = try signed { $0["jti"] = nil }
        let verified = try verifier.verify(jws, keys: Self.keys, now: Self.now)
        let segment = jws.split(separator: ".")[1]
        #expect(verified.jti == SHA256.hash(data: Data(segment.utf8)).map { String(format: "%02x", $0) }.joined())
        #expect(verified.jtiDerived)
    }
}

@Suite("Event decoding tolerances", .timeLimit(.minutes(10)))
struct EventDecodingTests {
    let iat: Int64 = 1_700_000_000

    func decode(_ events: JSONValue?) -> EventDecoding {
        EventDecoding.decode(events: events, issuedAt: iat)
    }

    let object: JSONValue = .object(["type": .string("email-enabled"), "sub": .string("s"), "event_time": .number(1_700_000_000_123)])

    @Test("events as a JSON string (real tokens), an object, or a one-element array decode the same")
    func shapes() {
        let expected = decode(.string(object.jsonText))
        #expect(expected.event?.type == .emailEnabled)
        #expect(decode(object) == expected)
        #expect(decode(.array([object])) == expected)
    }

    @Test("account-deleted (Apple's article) and account-delete (real tokens) are one type; the raw spelling is kept")
    func deletionSpellings() {
        for spelling in ["account-delete", "account-deleted"] {
            let event = decode(.object(["type": .string(spelling), "sub": .string("s")])).event
            #expect(event?.type == .accountDelete)
            #expect(event?.rawType == spelling)
        }
    }

    @Test("event_time in seconds is normalised to milliseconds; a missing one uses iat")
    func eventTime() {
        #expect(decode(.object(["type": .string("consent-revoked"), "sub": .string("s"), "event_time": .number(1_700_000_123)])).event?.eventTimeMillis == 1_700_000_123_000)
        #expect(decode(.object(["type": .string("consent-revoked"), "sub": .string("s"), "event_time": .number(1_700_000_123_456)])).event?.eventTimeMillis == 1_700_000_123_456)
        #expect(decode(.object(["type": .string("consent-revoked"), "sub": .string("s")])).event?.eventTimeMillis == iat * 1000)
    }

    @Test("is_private_email as the string \"true\"/\"false\" or a JSON boolean")
    func privateEmail() {
        func flag(_ value: JSONValue) -> Bool? {
            decode(.object(["type": .string("email-disabled"), "sub": .string("s"), "email": .string("a@b"), "is_private_email": value])).event?.isPrivateEmail
        }
        #expect(flag(.string("true")) == true)
        #expect(flag(.string("false")) == false)
        #expect(flag(.bool(true)) == true)
        #expect(flag(.bool(false)) == false)
    }

    @Test("Unreadable events are skipped with unreadable_event; an unknown type with unknown_type, keeping what was read")
    func skipped() {
        func skipReason(_ decoding: EventDecoding) -> SkipReason? {
            if case .skipped(let reason, _, _) = decoding { return reason }
            return nil
        }
        #expect(skipReason(decode(.string("{not json"))) == .unreadableEvent)
        #expect(skipReason(decode(nil)) == .unreadableEvent)
        #expect(skipReason(decode(.object(["sub": .string("s")]))) == .unreadableEvent)
        #expect(skipReason(decode(.object(["type": .string("consent-revoked")]))) == .unreadableEvent)
        #expect(skipReason(decode(.array([object, object]))) == .unreadableEvent)
        let unknown = decode(.object(["type": .string("phone-changed"), "sub": .string("s")]))
        #expect(skipReason(unknown) == .unknownType)
        #expect(unknown.event?.rawType == "phone-changed")
        #expect(unknown.event?.type == nil)
    }
}

@Suite("Configuration syntaxes", .timeLimit(.minutes(10)))
struct SyntaxTests {
    @Test("Durations use one syntax: 30s, 5m, 2h, 400d, 500ms; anything else names the expected form")
    func durations() throws {
        #expect(try DurationSyntax.parse("30s") == .seconds(30))
        #expect(try DurationSyntax.parse("5m") == .seconds(300))
        #expect(try DurationSyntax.parse("2h") == .seconds(7200))
        #expect(try DurationSyntax.parse("400d") == .seconds(400 * 86_400))
        #expect(try DurationSyntax.parse("500ms") == .milliseconds(500))
        for bad in ["", "5", "1h30m", "-5s", "5 s", "s", "5w"] {
            #expect(throws: DurationSyntax.ParseError.self) { try DurationSyntax.parse(bad) }
        }
        #expect(DurationSyntax.format(.seconds(3600)) == "1h")
        #expect(DurationSyntax.format(.seconds(90)) == "90s")
    }

    @Test("X-Forwarded-For is believed only from a trusted proxy")
    func trustedProxies() throws {
        let proxies = try TrustedProxies(parsing: "10.0.0.0/8, ::1")
        #expect(proxies.clientAddress(peer: "10.1.2.3", forwardedFor: "203.0.113.9") == "203.0.113.9")
        #expect(proxies.clientAddress(peer: "10.1.2.3", forwardedFor: "198.51.100.1, 203.0.113.9, 10.0.0.5") == "203.0.113.9")
        #expect(proxies.clientAddress(peer: "::1", forwardedFor: "203.0.113.9") == "203.0.113.9")
        #expect(proxies.clientAddress(peer: "192.0.2.1", forwardedFor: "203.0.113.9") == "192.0.2.1")
        #expect(proxies.clientAddress(peer: "10.1.2.3", forwardedFor: nil) == "10.1.2.3")
        #expect(TrustedProxies.none.clientAddress(peer: "10.1.2.3", forwardedFor: "1.2.3.4") == "10.1.2.3")
        #expect(throws: TrustedProxies.InvalidCIDR.self) { try TrustedProxies(parsing: "10.0.0.0/33") }
        #expect(throws: TrustedProxies.InvalidCIDR.self) { try TrustedProxies(parsing: "not-an-ip") }
    }

    @Test("Rejections are sampled per reason per minute; a genuine token is kept whole even once its reason's minute is full")
    func sampler() {
        var sampler = RejectionSampler(limitPerMinute: 3)
        let minute = Date(timeIntervalSince1970: 1_700_000_040)
        let admitted = (0..<10).filter { _ in sampler.admit(.badSignature, at: minute, genuineTokenAudience: nil) == .row }.count
        #expect(admitted == 3)
        let otherReason = sampler.admit(.unknownKey, at: minute, genuineTokenAudience: nil)
        let nextMinute = sampler.admit(.badSignature, at: minute.addingTimeInterval(60), genuineTokenAudience: nil)
        // Forged wrong_audience rejections fill that reason's minute; a genuine one still gets its token kept.
        let forged = (0..<10).map { _ in sampler.admit(.wrongAudience, at: minute, genuineTokenAudience: nil) }
        let genuine = sampler.admit(.wrongAudience, at: minute, genuineTokenAudience: "com.example.other")
        #expect(otherReason == .row)
        #expect(nextMinute == .row)
        #expect(forged == Array(repeating: .row, count: 3) + Array(repeating: .counted, count: 7))
        #expect(genuine == .rowWithToken)
    }

    @Test("Genuine tokens for another app: at most N kept whole per aud per hour; the rest sampled like any rejection, without the token")
    func genuineTokensPerAudience() {
        var sampler = RejectionSampler(limitPerMinute: 4, tokensPerAudiencePerHour: 3)
        let hour = Date(timeIntervalSince1970: 1_700_002_800)  // on the hour
        // A flood of one other app's genuine notifications within one minute.
        let flood = (0..<10).map { _ in sampler.admit(.wrongAudience, at: hour, genuineTokenAudience: "com.attacker.app") }
        #expect(flood == Array(repeating: .rowWithToken, count: 3) + Array(repeating: .row, count: 4) + Array(repeating: .counted, count: 3))
        // Another app has its own allowance; the next hour starts over.
        #expect(sampler.admit(.wrongAudience, at: hour.addingTimeInterval(3599), genuineTokenAudience: "com.example.typo") == .rowWithToken)
        #expect(sampler.admit(.wrongAudience, at: hour.addingTimeInterval(3600), genuineTokenAudience: "com.attacker.app") == .rowWithToken)
    }
}
