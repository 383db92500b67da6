import Foundation
import SiwaApp
import SiwaHTTP
import SiwaTestSupport
import Testing

/// DNS rebinding: a page on evil.example that points its name at 127.0.0.1 reaches the admin
/// listener from an operator's browser, but its requests carry `Host: evil.example`.
@Suite("Admin listener: answers only Hosts it is configured for", .timeLimit(.minutes(10)))
struct AdminHostTests {
    /// One raw HTTP/1.1 request with the given Host; the status line's code.
    func status(port: Int, path: String, host: String?) async throws -> (code: Int, text: String) {
        let connection = try RawConnection(port: port)
        defer { connection.close() }
        let hostLine = host.map { "Host: \($0)\r\n" } ?? ""
        let version = host == nil ? "HTTP/1.0" : "HTTP/1.1"
        connection.send("GET \(path) \(version)\r\n\(hostLine)Connection: close\r\n\r\n")
        let (text, _) = await connection.receive()
        let code = text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return (code, text)
    }

    @Test("A Host name not in SIWA_ADMIN_HOSTS gets 421 on every admin route; IP addresses and listed names are served; the public listener is unaffected")
    func rebindingRefused() async throws {
        let h = try await Harness.start { $0.http.adminHosts = ["localhost", "siwa-events-admin"] }
        let adminPort = try #require(Int(h.server.adminBaseURL.split(separator: ":").last ?? ""))
        for path in ["/metrics", "/v1/notifications", "/dashboard", "/openapi.yaml", "/health/ready"] {
            let refused = try await status(port: adminPort, path: path, host: "evil.example:\(adminPort)")
            #expect(refused.code == 421, "\(path): \(refused.text.prefix(200))")
            #expect(refused.text.contains("misdirected_request") && refused.text.contains("SIWA_ADMIN_HOSTS"), "\(path)")
            #expect(try await status(port: adminPort, path: path, host: "evil.example.").code == 421, "\(path), trailing dot")
        }
        for host in ["127.0.0.1:\(adminPort)", "localhost:\(adminPort)", "LOCALHOST", "siwa-events-admin:8081", "[::1]:\(adminPort)", "10.1.2.3"] {
            #expect(try await status(port: adminPort, path: "/health/ready", host: host).code == 200, "\(host)")
        }
        #expect(try await status(port: adminPort, path: "/health/ready", host: nil).code == 200, "HTTP/1.0 without Host")
        // Look-alikes of allowed names and addresses are names.
        for host in ["127.0.0.1.evil.example", "localhost.evil.example", "siwa-events-admin.evil.example:80", "[::1]evil"] {
            #expect(try await status(port: adminPort, path: "/health/ready", host: host).code == 421, "\(host)")
        }
        // The public listener serves Apple whatever Host the proxy passes.
        let publicPort = try #require(Int(h.server.baseURL.split(separator: ":").last ?? ""))
        let publicAnswer = try await status(port: publicPort, path: "/health/live", host: "siwa.example.com")
        #expect(publicAnswer.code == 200, "\(publicPort): \(publicAnswer.text.prefix(300))")
        await h.stop()
    }
}
