import Foundation

/// The receiver's path over unauthenticated bytes, for `scripts/fuzz` (libFuzzer calls it on every
/// input) and for the suite (which replays `fuzz/corpus/` through it): body JSON → `payload` →
/// `CompactJWS` → header check → claims JSON → `events`, checking on the way the properties each
/// parser must keep. Foundation-only, like everything it calls, so the fuzzer compiles it without
/// Crypto. A broken property is returned, not trapped on, so the suite records it as a failure; the
/// fuzz entry point traps on it so that libFuzzer keeps the input.
package enum FuzzHarness {
    /// Runs `input` as an HTTP body and, when it is not a body with a string `payload`, as a bare
    /// token. Returns the first broken property, or nil.
    package static func run(_ input: some DataProtocol) -> String? {
        // base64url over arbitrary bytes: decoding the encoding gives the bytes back.
        let bytes = Array(input)
        guard let decoded = Base64URL.decode(Base64URL.encode(bytes)), Array(decoded) == bytes else {
            return "base64url: decode(encode(input)) is not the input"
        }
        var token = String(validating: bytes, as: UTF8.self)
        if let body = JSONValue.parse(input) {
            if let broken = roundTrip(body, "body") { return broken }
            if let payload = body["payload"]?.stringValue { token = payload }
        }
        guard let token else { return nil }
        // One spelling per byte string: whatever decodes encodes back to the same text.
        if let decoded = Base64URL.decode(token), Base64URL.encode(decoded) != token {
            return "base64url: \(token.prefix(80)) decodes but encodes back differently"
        }
        return run(token: token)
    }

    private static func run(token: String) -> String? {
        let jws: CompactJWS
        do {
            jws = try CompactJWS(token)
        } catch {
            guard case .malformed = error else { return "CompactJWS threw \(error), which is not malformed" }
            return nil
        }
        let parts = jws.raw.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, jws.signingInput == "\(parts[0]).\(parts[1])", jws.payloadSegment == parts[1] else {
            return "CompactJWS: the segments or the signing input do not match the token"
        }
        guard Base64URL.encode(jws.payload) == parts[1], Base64URL.encode(jws.signature) == parts[2] else {
            return "CompactJWS: a decoded segment does not encode back to the segment"
        }
        guard let header = jws.header.objectValue else { return "CompactJWS: the header is not an object" }
        if let broken = roundTrip(.object(header), "header") { return broken }
        do {
            let kid = try jws.checkHeader()
            guard jws.algorithm == "RS256", !kid.isEmpty, kid == jws.kid else { return "checkHeader accepted alg \(jws.algorithm ?? "nil")" }
        } catch {
            guard [.unsupportedAlgorithm, .unsupportedHeader, .unknownKey].contains(error.reason) else {
                return "checkHeader threw \(error)"
            }
        }
        // The rejection path reads the claims of any well-formed token, signed or not.
        guard let claims = JSONValue.parse(jws.payload) else { return nil }
        if let broken = roundTrip(claims, "claims") { return broken }
        // Without a verified iat (rejection records), then with one in the verifier's range.
        if let broken = check(EventDecoding.decode(events: claims["events"], issuedAt: 0)) { return broken }
        if let iat = claims["iat"]?.numberValue, iat >= 0, iat < EventDecoding.millisecondsThreshold {
            return check(EventDecoding.decode(events: claims["events"], issuedAt: Int64(iat)))
        }
        return nil
    }

    /// `jsonText` is JSON that parses back to the same value, and to the same bytes (String's `==`
    /// would accept any canonically equivalent text).
    private static func roundTrip(_ value: JSONValue, _ what: String) -> String? {
        let text = value.jsonText
        guard let again = JSONValue.parse(Array(text.utf8)) else { return "\(what): its jsonText is not JSON: \(text.prefix(200))" }
        guard again == value, again.jsonText.utf8.elementsEqual(text.utf8) else {
            return "\(what): jsonText does not parse back to the same value and text: \(text.prefix(200))"
        }
        return nil
    }

    /// An event is only ever produced whole: known type, a `sub`, a time after 1970.
    private static func check(_ decoding: EventDecoding) -> String? {
        switch decoding {
        case .event(let event):
            guard event.type != nil, !event.sub.isEmpty, !event.rawType.isEmpty, event.eventTimeMillis >= 0 else {
                return "EventDecoding: an incomplete event \(event)"
            }
        case .skipped(.unknownType, _, let event):
            guard let event, event.type == nil, !event.sub.isEmpty else { return "EventDecoding: unknown type without its event" }
        case .skipped(.unreadableEvent, _, let event):
            guard event == nil else { return "EventDecoding: an unreadable event with an event" }
        }
        return nil
    }
}
