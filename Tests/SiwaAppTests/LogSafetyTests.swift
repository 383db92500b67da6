import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaTestSupport
import Testing

/// Values from unverified tokens reach the log and the terminal: none may forge a line or a key.
@Suite("Log lines and CLI output under hostile values", .timeLimit(.minutes(10)))
struct LogSafetyTests {
    /// A logfmt line's `key=value` pairs (between `label:` and ` [source]`), quoted values unescaped.
    static func pairs(_ line: Substring) -> [String: String]? {
        guard let colon = line.range(of: ": ") else { return nil }
        var rest = line[colon.upperBound...]
        var result: [String: String] = [:]
        while !rest.hasPrefix("[") {
            guard let equals = rest.firstIndex(of: "=") else { return nil }
            let key = String(rest[..<equals])
            rest = rest[rest.index(after: equals)...]
            var value = ""
            if rest.first == "\"" {
                rest = rest.dropFirst()
                while let character = rest.first, character != "\"" {
                    if character == "\\" {
                        rest = rest.dropFirst()
                        switch rest.first {
                        case "n": value += "\n"
                        case "r": value += "\r"
                        case "t": value += "\t"
                        case "u":
                            let hex = rest.dropFirst(2).prefix { $0 != "}" }
                            value.unicodeScalars.append(Unicode.Scalar(UInt32(hex, radix: 16)!)!)
                            rest = rest.dropFirst(2 + hex.count)
                        case let other?: value.append(other)
                        case nil: return nil
                        }
                    } else {
                        value.append(character)
                    }
                    rest = rest.dropFirst()
                }
                rest = rest.dropFirst()  // the closing quote
            } else {
                let end = rest.firstIndex(of: " ") ?? rest.endIndex
                value = String(rest[..<end])
                rest = rest[end...]
            }
            result[key] = value
            guard rest.first == " " else { return nil }
            rest = rest.dropFirst()
        }
        return result
    }

    static let hostile = [
        "evil\n2026-01-01T00:00:00+0000 info siwa-events: outcome=accepted jti=fake [SiwaHTTP] delivery",
        "x outcome=accepted",
        "quote\"d \\ back\u{1b}[2Jslash\r\t\u{0}",
        // Past ASCII: Unicode's spaces, the C1 next-line and the line separator quote too.
        "em\u{2003}space", "no-break\u{A0}space", "next\u{85}line", "line\u{2028}separator",
        "",  // last: the binary test posts all but this one
    ]

    @Test("Each hostile value stays one quoted value of its own key: no new line, no new key, the value read back exactly")
    func valuesCannotForge() throws {
        for value in Self.hostile {
            let event = LogEvent(level: .info, message: "delivery\nforged", metadata: nil, source: "SiwaHTTP", file: "", function: "", line: 0)
            let line = LineLogHandler.render(event: event, label: "siwa-events", metadata: ["jti": .string(value), "outcome": "rejected"], timestamp: "T")
            #expect(line.dropLast().allSatisfy { $0 != "\n" && $0 != "\r" }, "\(line)")
            #expect(line.hasSuffix("[SiwaHTTP] delivery\\nforged\n"))
            let pairs = try #require(Self.pairs(line.dropLast()), "\(line)")
            #expect(pairs == ["jti": value, "outcome": "rejected"], "\(line)")
        }
        // Plain words stay bare, as StreamLogHandler writes them.
        let plain = LineLogHandler.render(event: LogEvent(level: .info, message: "m", metadata: nil, source: "S", file: "", function: "", line: 0), label: "l", metadata: ["jti": "abc-1.2", "aud": "com.example.app"], timestamp: "T")
        #expect(plain == "T info l: aud=com.example.app jti=abc-1.2 [S] m\n")
        let accented = LineLogHandler.render(event: LogEvent(level: .info, message: "m", metadata: nil, source: "S", file: "", function: "", line: 0), label: "l", metadata: ["name": "café-日本"], timestamp: "T")
        #expect(accented == "T info l: name=café-日本 [S] m\n")
    }

    @Test("JSON lines: one object per line, every value read back exactly")
    func jsonLines() throws {
        for value in Self.hostile {
            let event = LogEvent(level: .warning, message: "delivery", metadata: nil, source: "SiwaHTTP", file: "", function: "", line: 0)
            let line = LineLogHandler.renderJSON(event: event, label: "siwa-events", metadata: ["jti": .string(value), "tags": ["a", "b"]], timestamp: "T")
            #expect(line.dropLast().allSatisfy { $0 != "\n" })
            let object = try #require(JSONValue.parse(Data(line.utf8)))
            #expect(object["jti"] == .string(value))
            #expect(object["tags"] == .array([.string("a"), .string("b")]))
            #expect(object["level"] == .string("warning") && object["message"] == .string("delivery") && object["time"] == .string("T"))
        }
    }

    /// Posts a forged token (an impostor's signature under the real kid) whose jti is `jti`.
    static func postForged(jti: String, keys: TestBinary.Keys, port: Int) async throws -> Int {
        let impostor = try AppleStyleSigner.generate()
        var claims = AppleStyleSigner.claims(aud: keys.aud, type: "consent-revoked", sub: "001.forged.1", eventTime: Date(), issuedAt: Date()).objectValue!
        claims["jti"] = .string(jti)
        let token = try impostor.sign(header: .object(["kid": .string(keys.signer.kid), "alg": .string("RS256")]), claims: .object(claims))
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(port)/apple/notifications")
        request.method = .POST
        request.body = .bytes(ByteBuffer(string: AppleStyleSigner.body(token)))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(60))
        _ = try await response.body.collect(upTo: 1 << 16)
        return Int(response.status.code)
    }

    @Test("serve: hostile jtis give one delivery line each in text and JSON; `rejections list` prints them escaped; bad log settings exit 78")
    func binary() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        for format in ["text", "json"] {
            let serving = try await TestBinary.startServing(
                environment: [
                    "DATABASE_URL": databaseURL, "SIWA_APPLE_JWKS_URL": keys.jwksURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_LOG_FORMAT": format,
                ], directory: keys.directory)
            for jti in Self.hostile.dropLast() {
                #expect(try await Self.postForged(jti: jti, keys: keys, port: serving.port) == 401)
            }
            serving.process.signal(SIGTERM)
            #expect(await serving.process.waitForExit() == 0)
            #expect(await serving.output.waitForEnd(), "\(format): the output did not end with the process")
            let lines = serving.output.text.split(separator: "\n")
            #expect(!lines.contains { $0.hasPrefix("2026-01-01") }, "a forged line")
            switch format {
            case "text":
                let deliveries = lines.filter { $0.hasSuffix("] delivery") }.compactMap(Self.pairs)
                #expect(deliveries.count == Self.hostile.count - 1, "\(lines)")
                #expect(deliveries.allSatisfy { $0["outcome"] == "rejected" && $0["reason"] == "bad_signature" })
                #expect(Set(deliveries.compactMap { $0["jti"] }) == Set(Self.hostile.dropLast().map { $0.replacingOccurrences(of: "\u{0}", with: "") }))
            default:
                let objects = lines.map { JSONValue.parse(Data($0.utf8)) }
                #expect(objects.allSatisfy { $0?["message"]?.stringValue != nil }, "\(lines.filter { JSONValue.parse(Data($0.utf8)) == nil })")
                let deliveries = objects.compactMap { $0 }.filter { $0["message"] == .string("delivery") }
                #expect(deliveries.count == Self.hostile.count - 1)
                #expect(deliveries.allSatisfy { $0["outcome"] == .string("rejected") })
            }
        }
        let listed = try await TestBinary.run(["rejections", "list"], environment: ["DATABASE_URL": databaseURL], directory: keys.directory)
        #expect(listed.status == 0, "\(listed.stderr)")
        #expect(listed.stdout.contains(#"evil\n2026-01-01"#), "\(listed.stdout)")
        #expect(listed.stdout.contains(#"\u{1b}[2J"#))
        #expect(!listed.stdout.contains("\u{1b}") && !listed.stdout.split(separator: "\n").contains { $0.hasPrefix("2026-01-01") })

        let badLevel = try await TestBinary.run(["serve"], environment: ["SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_LOG_LEVEL": "loud"], directory: keys.directory)
        #expect(badLevel.status == 78)
        #expect(badLevel.stderr.contains("SIWA_LOG_LEVEL") && badLevel.stderr.contains("loud"), "\(badLevel.stderr)")
        let badFormat = try await TestBinary.run(["notifications", "list"], environment: ["DATABASE_URL": databaseURL, "SIWA_LOG_FORMAT": "xml"], directory: keys.directory)
        #expect(badFormat.status == 78)
        #expect(badFormat.stderr.contains("SIWA_LOG_FORMAT") && badFormat.stderr.contains("text or json"), "\(badFormat.stderr)")
        #expect(!FileManager.default.fileExists(atPath: "\(keys.directory)/.siwa"))
    }
}
