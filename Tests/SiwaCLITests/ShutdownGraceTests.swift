import AsyncHTTPClient
import Glibc
import Foundation
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaTestSupport
import Testing

@Suite("SIGTERM past the grace period")
struct ShutdownGraceTests {
    @Test("A request still arriving when SIWA_SHUTDOWN_GRACE runs out: the process is cut short and exits 1")
    func graceExceeded() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let databaseURL = try await TestBinary.databaseURL()
        let port = TestBinary.freePort()
        let environment = ProcessInfo.processInfo.environment.merging([
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_HTTP_REQUEST_TIMEOUT": "120s", "SIWA_SHUTDOWN_GRACE": "1s", "SIWA_PORT": "\(port)", "SIWA_ADMIN_PORT": "\(TestBinary.freePort())",
        ]) { $1 }
        let server = try Subprocess.start(TestBinary.url.path, ["serve"], environment: environment)
        #expect(await TestBinary.waitReady(port: port))
        // A delivery whose body is still arriving (10 of 1,000 bytes): graceful shutdown waits for it.
        let socket = try Self.connect(port: port)
        defer { close(socket) }
        let head = "POST /apple/notifications HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"payload\""
        #expect(head.utf8CString.withUnsafeBufferPointer { send(socket, $0.baseAddress, $0.count - 1, 0) } == head.utf8.count)
        let signalled = ContinuousClock.now
        server.signal(SIGTERM)
        let status = await server.waitForExit()  // the raw wait status: exit code 1, not a signal
        #expect(status & 0x7f == 0 && (status >> 8) & 0xff == 1, "wait status \(status)")
        // The grace period, then the cancellation bound (5 s): not the request's 120 s deadline.
        #expect(ContinuousClock.now - signalled < .seconds(60))
    }

    static func connect(port: Int) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(descriptor >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        try #require(connected, "connect: \(String(cString: strerror(errno)))")
        return descriptor
    }
}
