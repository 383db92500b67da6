import Foundation
import SiwaDomain
import Testing

/// The `/standin` routes mint codes and flip the failure switch without any credential: they are
/// for this machine's tests and user. A page in a browser here must not reach them — neither by
/// naming its own domain for 127.0.0.1 (DNS rebinding: its `Host`) nor by a cross-site form POST
/// (only `application/json`, which a page cannot send cross-site without a CORS preflight).
@Suite("/standin routes: this machine only, JSON only", .timeLimit(.minutes(10)))
struct ControlRouteTests {
    static let codeRequest = #"{"client_id":"com.example.app","sub":"001.control.1"}"#

    @Test("A /standin route answers only a loopback Host: another name gets a JSON 421 and nothing is done; Apple's routes are unaffected")
    func loopbackHostOnly() async throws {
        try await StandIn.run { standIn in
            let port = try #require(standIn.url.port)
            for host in [
                "evil.example:\(port)", "evil.example", "127.0.0.1.evil.example:\(port)", "localhost.evil.example", "127.evil.example",
                "localhost:\(port).evil.example", "10.0.0.1:\(port)", "[::2]:\(port)", "[::1]x", "",
            ] {
                let codes = try await standIn.post("standin/codes", body: Self.codeRequest, contentType: "application/json", host: host)
                #expect(codes.status == 421 && codes.json?["error"] == "misdirected_request" && codes.json?["code"] == nil, "\(host): \(codes.status) \(codes.body)")
                let failures = try await standIn.post(
                    "standin/failures", body: #"{"endpoint":"token","status":503}"#, contentType: "application/json", host: host)
                #expect(failures.status == 421, "\(host): \(failures.status) \(failures.body)")
                let users = try await standIn.post("standin/users", body: #"{"sub":"001.a.1","revoked":true}"#, contentType: "application/json", host: host)
                #expect(users.status == 421, "\(host): \(users.status) \(users.body)")
                let revocations = try await standIn.get("standin/revocations", host: host)
                #expect(revocations.status == 421 && revocations.json?["revocations"] == nil, "\(host): \(revocations.status) \(revocations.body)")
                // /auth/token is Apple's, answered to any Host (the failure switch above was not set).
                let exchanged = try await standIn.post(
                    "auth/token", body: StandIn.encode([
                        ("grant_type", "authorization_code"), ("client_id", StandIn.clientID), ("client_secret", try standIn.secret()), ("code", standIn.code()),
                    ]), contentType: "application/x-www-form-urlencoded", host: host)
                #expect(exchanged.status == 200, "\(host): \(exchanged.status) \(exchanged.body)")
            }
            for host in ["127.0.0.1:\(port)", "localhost:\(port)", "LocalHost", "127.9.8.7:\(port)", "[::1]:\(port)", "[::1]"] {
                let codes = try await standIn.post("standin/codes", body: Self.codeRequest, contentType: "application/json", host: host)
                #expect(codes.status == 200 && codes.json?["code"]?.stringValue != nil, "\(host): \(codes.status) \(codes.body)")
                #expect(try await standIn.get("standin/revocations", host: host).status == 200, "\(host)")
            }
        }
    }

    @Test("A /standin route takes only a JSON body: a form, text/plain or no Content-Type gets a JSON 415 and no code")
    func jsonBodiesOnly() async throws {
        try await StandIn.run { standIn in
            let form = "client_id=com.example.app&sub=001.control.2"
            for (body, contentType) in [
                (form, "application/x-www-form-urlencoded"), (form, "multipart/form-data; boundary=x"), (Self.codeRequest, "text/plain"),
                (Self.codeRequest, nil), (Self.codeRequest, "application/jsonx"),
            ] as [(String, String?)] {
                for path in ["standin/codes", "standin/users", "standin/failures"] {
                    let answer = try await standIn.post(path, body: body, contentType: contentType)
                    #expect(
                        answer.status == 415 && answer.json?["error"] == "unsupported_media_type"
                            && answer.json?["message"]?.stringValue?.contains("application/json") == true,
                        "\(path) \(contentType ?? "none"): \(answer.status) \(answer.body)")
                }
            }
            let json = try await standIn.post("standin/codes", body: Self.codeRequest, contentType: "application/json; charset=utf-8")
            #expect(json.status == 200 && json.json?["code"]?.stringValue != nil, "\(json.status) \(json.body)")
        }
    }
}
