import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The endpoint check (`SIWA_PUBLIC_URL`) starts with a DNS lookup of the URL's host. In `serve`
/// the event loops are also Swift concurrency's executor, so a lookup that blocks one of them
/// stalls the listeners for as long as the resolver takes. Here the resolver genuinely hangs:
/// `serve` runs in a mount namespace of its own whose /etc/resolv.conf names a loopback UDP socket
/// this test holds and never answers (loopback only: no packet leaves the machine).
@Suite("Endpoint check: a hanging DNS resolver", .timeLimit(.minutes(10)))
struct EndpointResolverTests {
    @Test("while the endpoint check's DNS lookup hangs, /health/live answers on both listeners, each before the lookup ends")
    func hangingResolverDoesNotStallListeners() async throws {
        let keys = try await TestBinary.Keys.make()
        defer { keys.remove() }
        let nameserver = SilentNameserver()
        // glibc waits at most 30 s a try; two tries: the lookup hangs at least a minute.
        let resolvConf = "\(keys.directory)/resolv.conf"
        try "nameserver \(nameserver.address)\noptions timeout:30 attempts:2\n".write(toFile: resolvConf, atomically: true, encoding: .utf8)
        let environment = ProcessInfo.processInfo.environment.merging([
            "DATABASE_URL": try await TestBinary.databaseURL(), "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_PUBLIC_URL": "https://endpoint.siwa-resolver-test.example/apple/notifications", "SIWA_PORT": "0", "SIWA_ADMIN_PORT": "0",
        ]) { $1 }
        // unshare execs sh, which execs the binary: the child's pid is the server's.
        let (process, output) = try ChildOutput.start(
            "/usr/bin/unshare",
            ["--mount", "--", "/bin/sh", "-c", #"mount --bind "$0" /etc/resolv.conf && exec "$@""#, resolvConf, TestBinary.url.path, "serve"],
            environment: environment, workingDirectory: keys.directory)
        defer { process.signal(SIGKILL) }

        let port = try #require(await output.port(loggedWith: "siwa-events listening", within: .seconds(90)), "\(output.text.suffix(4000))")
        let adminPort = try #require(await output.port(loggedWith: "admin listener (API, dashboard, metrics)", within: .seconds(90)), "\(output.text.suffix(4000))")
        // The endpoint check's lookup reached the nameserver: it waits for an answer that never comes.
        #expect(await nameserver.waitForQuery(within: .seconds(90)), "no DNS query from the endpoint check: \(output.text.suffix(4000))")

        // Each request on a connection of its own, so the listeners spread them over all their
        // event loops, the one the lookup would block among them. A blocked loop answers only when
        // the lookup gives up (a minute and more); what proves it free is an answer while the
        // lookup still hangs (checked after the last request), not how fast a loaded machine is:
        // a bound of 2 s failed one answer at 2.9 s in a full suite on 2 cores.
        var slow: [String] = []
        for (name, listener) in [("public", port), ("admin", adminPort)] {
            for attempt in 0..<4 {
                var request = HTTPClientRequest(url: "http://127.0.0.1:\(listener)/health/live")
                request.headers.add(name: "Connection", value: "close")
                let start = ContinuousClock.now
                let status: Int?
                do {
                    let response = try await HTTPClient.shared.execute(request, timeout: .seconds(20))
                    _ = try await response.body.collect(upTo: 1 << 16)
                    status = Int(response.status.code)
                } catch {
                    status = nil
                }
                let elapsed = ContinuousClock.now - start
                if status != 200 { slow.append("\(name) #\(attempt): \(status.map(String.init) ?? "no answer") after \(elapsed)") }
            }
        }
        #expect(slow.isEmpty, "/health/live while the endpoint check's DNS lookup hangs: \(slow)")
        // The lookup was still hanging after the last answer: the check has not finished.
        #expect(!output.text.contains("endpoint check:"), "\(output.text.suffix(4000))")

        process.signal(SIGKILL)
        _ = await process.waitForExit()
    }
}

/// A UDP socket on port 53 of a loopback address of its own (127.x.y.z, free of any other
/// resolver), never read: a DNS query sent to it gets no answer, and no ICMP error either, so the
/// client waits its full timeout. Closed when released.
final class SilentNameserver: Sendable {
    let address: String
    private let descriptor: Int32

    init() {
        while true {
            let address = "127.\(Int.random(in: 1...254)).\(Int.random(in: 0...255)).\(Int.random(in: 1...254))"
            let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
            precondition(descriptor >= 0, "socket: \(String(cString: strerror(errno)))")
            var socketAddress = sockaddr_in()
            socketAddress.sin_family = sa_family_t(AF_INET)
            socketAddress.sin_port = in_port_t(53).bigEndian
            socketAddress.sin_addr.s_addr = inet_addr(address)
            let bound = withUnsafePointer(to: &socketAddress) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            if bound {
                (self.address, self.descriptor) = (address, descriptor)
                return
            }
            let error = errno
            close(descriptor)
            precondition(error == EADDRINUSE, "bind \(address):53: \(String(cString: strerror(error)))")
        }
    }

    deinit { close(descriptor) }

    /// Whether a query arrives within `limit` (it stays unread): `poll`, on a thread of its own.
    func waitForQuery(within limit: Duration) async -> Bool {
        let (descriptor, milliseconds) = (self.descriptor, Int32(limit.components.seconds * 1000))
        return await withCheckedContinuation { continuation in
            Thread {
                var ready = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                continuation.resume(returning: poll(&ready, 1, milliseconds) == 1)
            }.start()
        }
    }
}
