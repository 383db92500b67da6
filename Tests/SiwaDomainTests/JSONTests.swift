import Foundation
import SiwaDomain
import Testing

@Suite("JSON and base64url on the hot path", .timeLimit(.minutes(10)))
struct JSONTests {
    func parse(_ text: String) -> JSONValue? { JSONValue.parse(Data(text.utf8)) }

    @Test("Parses what Foundation parses: nesting, escapes, surrogate pairs, numbers")
    func parsesValidJSON() {
        #expect(parse(#" {"a": [1, -2.5, 3e2, true, false, null], "b": "x\"y\\z\/\n\u00e9\ud83d\ude00"} "#) == .object([
            "a": .array([.number(1), .number(-2.5), .number(300), .bool(true), .bool(false), .null]),
            "b": .string("x\"y\\z/\né😀"),
        ]))
        #expect(parse("1670016125295") == .number(1_670_016_125_295))
        #expect(parse(#""plain""#) == .string("plain"))
        #expect(parse("[]") == .array([]))
        #expect(parse("{}") == .object([:]))
    }

    @Test("Refuses what is not strict JSON", arguments: [
        "", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "1e", "tru", "nul", "\"unterminated", "\"bad \\x escape\"",
        "\"\\ud83d\"", "{\"a\":1} x", "{a:1}", "'a'", "{\"a\":1,\"a\":2}", "1e400", "\"tab\there\"",
    ])
    func refusesInvalidJSON(text: String) {
        #expect(parse(text) == nil)
    }

    @Test("Nesting is bounded, so a hostile body cannot exhaust the stack")
    func boundedNesting() {
        #expect(parse(String(repeating: "[", count: 60) + String(repeating: "]", count: 60)) != nil)
        #expect(parse(String(repeating: "[", count: 100_000)) == nil)
    }

    @Test("jsonText round-trips through the parser with sorted keys")
    func roundTrip() {
        let value: JSONValue = .object(["b": .string("q\"\\\n\u{1}é"), "a": .array([.number(1.5), .number(-3), .null, .bool(true)])])
        #expect(value.jsonText == #"{"a":[1.5,-3,null,true],"b":"q\"\\\n\u0001é"}"#)
        #expect(parse(value.jsonText) == value)
    }

    @Test("jsonText is one text per value whatever the dictionary's layout, keys not in NFC included")
    func keyOrderIgnoresLayout() {
        // Found by scripts/fuzz (fuzz/corpus/crash-jsontext-key-order.json): the text of
        // {"éI":1,"é":2}, the second é spelled e + U+0301, followed the dictionary's layout.
        let expected = Array("{\"e\u{301}\":2,\"\u{e9}I\":1}".utf8)
        for capacity in 0..<32 {
            for reversed in [false, true] {
                var members = [String: JSONValue](minimumCapacity: capacity)
                for (key, value) in reversed ? [("e\u{301}", 2.0), ("\u{e9}I", 1)] : [("\u{e9}I", 1), ("e\u{301}", 2)] {
                    members[key] = .number(value)
                }
                #expect(Array(JSONValue.object(members).jsonText.utf8) == expected, "capacity \(capacity)")
            }
        }
    }

    @Test("base64url round-trips every length and refuses padding, the standard alphabet and non-canonical bits")
    func base64url() {
        for length in 0..<40 {
            let bytes = Data((0..<length).map { UInt8(truncatingIfNeeded: $0 * 37 + 11) })
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URL.decode(text) == bytes)
            #expect(text == bytes.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: ""))
        }
        #expect(Base64URL.decode("QQ") == Data([0x41]))
        #expect(Base64URL.decode("QR") == nil)
        #expect(Base64URL.decode("QQ==") == nil)
        #expect(Base64URL.decode("a+b/") == nil)
        #expect(Base64URL.decode("A") == nil)
    }
}

@Suite("RFC 3339 date-times, as the API documents them", .timeLimit(.minutes(10)))
struct RFC3339Tests {
    @Test("Any offset, year and fraction a date-time may have; nothing else")
    func parses() {
        #expect(rfc3339("2026-11-21T08:00:00Z") == Date(timeIntervalSince1970: 1_795_248_000))
        #expect(rfc3339("2026-11-21T08:00:00.250z") == Date(timeIntervalSince1970: 1_795_248_000.25))
        #expect(rfc3339("2026-11-21T10:30:00+02:30") == Date(timeIntervalSince1970: 1_795_248_000))
        #expect(rfc3339("0761-04-07T15:37:02-22:03") == Date(timeIntervalSince1970: -38_143_909_198))
        #expect(rfc3339("2024-02-29T00:00:00Z") != nil)
        for bad in ["", "2026-11-21", "2026-11-21T08:00:00", "2023-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-21T24:00:00Z",
                    "2026-11-21T08:00:00+24:00", "2026-11-21T08:00:00.Z", "2026-11-21T08:00:00Zjunk", "２０26-11-21T08:00:00Z"] {
            #expect(rfc3339(bad) == nil, "\(bad)")
        }
    }
}
