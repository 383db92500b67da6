#if canImport(Glibc)
import Glibc
#endif
import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaHTTP
import SiwaTestSupport
import Synchronization
import Testing

/// A plain TCP connection to a loopback port, for clients no HTTP library would be: slow, idle, many.
/// Its blocking calls run on a thread of their own, never on the cooperative pool: the in-process
/// servers of every running test answer on that pool, which a blocked `recv` would starve.
final class RawConnection: @unchecked Sendable {
    private(set) var descriptor: Int32

    init(port: Int) throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw POSIXFailure(call: "connect", code: errno) }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)  // a bound against a hang
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close() }

    /// Closes the socket once (a second close could close a descriptor the process reused since).
    func close() {
        guard descriptor >= 0 else { return }
        Glibc.close(descriptor)
        descriptor = -1
    }

    /// False once the server has closed the connection.
    @discardableResult
    func send(_ text: String) -> Bool {
        text.utf8CString.withUnsafeBufferPointer { bytes in
            Glibc.send(descriptor, bytes.baseAddress, bytes.count - 1, Int32(MSG_NOSIGNAL)) == bytes.count - 1
        }
    }

    /// Reads until `until` holds for what was read, the server closes (`closed`), or 30 s pass.
    func receive(until: @escaping @Sendable (String) -> Bool = { _ in false }) async -> (text: String, closed: Bool) {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: self.receiveBlocking(until: until)) }.start()
        }
    }

    private func receiveBlocking(until: (String) -> Bool) -> (text: String, closed: Bool) {
        var text = ""
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !until(text) {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return (text, false) }  // 30 s passed
            if count <= 0 { return (text, true) }
            text += String(decoding: buffer[..<count], as: UTF8.self)
        }
        return (text, false)
    }

    /// Whether the server has closed the connection (without waiting).
    var isClosedByServer: Bool {
        var byte: UInt8 = 0
        let count = recv(descriptor, &byte, 1, Int32(MSG_DONTWAIT | MSG_PEEK))
        return count == 0 || (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    }

    struct POSIXFailure: Error { let call: String; let code: Int32 }
}

@Suite("Connection limits: deadlines per phase, a cap per listener", .timeLimit(.minutes(10)))
struct ConnectionLimitTests {
    // MARK: The deadlines, on an embedded event loop (time advanced by hand)

    final class Cuts: Sendable {
        let all = Mutex<[ConnectionCut]>([])
        var list: [ConnectionCut] { all.withLock { $0 } }
    }

    static func channel(tls: Bool = false) throws -> (EmbeddedChannel, Cuts) {
        var limits = ConnectionLimits()
        limits.requestTimeout = .seconds(30)
        limits.idleTimeout = .seconds(150)
        limits.firstRequestTimeout = .seconds(10)
        limits.tlsHandshakeTimeout = .seconds(10)
        let cuts = Cuts()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ConnectionDeadlines(limits: limits, tls: tls) { cut in cuts.all.withLock { $0.append(cut) } })
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, cuts)
    }

    static func event(_ channel: EmbeddedChannel, _ event: ConnectionPhaseEvent) {
        channel.pipeline.triggerUserOutboundEvent(event, promise: nil)
    }

    @Test("A request trickled a byte a second is cut at its deadline from its first byte, whatever arrives after")
    func trickledRequestCut() throws {
        let (channel, cuts) = try Self.channel()
        try channel.writeInbound(ByteBuffer(string: "P"))
        for _ in 0..<29 {
            channel.embeddedEventLoop.advanceTime(by: .seconds(1))
            try channel.writeInbound(ByteBuffer(string: "x"))
        }
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
        #expect(cuts.list == [.requestTimeout])
    }

    @Test("A connection that sends nothing is cut at the first-request deadline; a first byte in time starts the request's own")
    func firstRequestDeadline() throws {
        let (silent, silentCuts) = try Self.channel()
        silent.embeddedEventLoop.advanceTime(by: .seconds(9))
        #expect(silent.isActive)
        silent.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!silent.isActive)
        #expect(silentCuts.list == [.firstRequestTimeout])

        let (prompt, promptCuts) = try Self.channel()
        prompt.embeddedEventLoop.advanceTime(by: .seconds(9))
        try prompt.writeInbound(ByteBuffer(string: "P"))
        prompt.embeddedEventLoop.advanceTime(by: .seconds(29))
        #expect(prompt.isActive)
        prompt.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!prompt.isActive)
        #expect(promptCuts.list == [.requestTimeout])
    }

    @Test("An idle connection closes at the idle timeout, not before; a request read and answered returns it to idle")
    func idleAndKeepAlive() throws {
        let (channel, cuts) = try Self.channel()
        channel.embeddedEventLoop.advanceTime(by: .seconds(9))  // the first request comes in time
        #expect(channel.isActive)
        // Keep-alive traffic: requests well inside their deadline, answers that take their time.
        for _ in 0..<3 {
            try channel.writeInbound(ByteBuffer(string: "GET / HTTP/1.1\r\n\r\n"))
            channel.embeddedEventLoop.advanceTime(by: .seconds(10))
            Self.event(channel, .requestRead)
            channel.embeddedEventLoop.advanceTime(by: .seconds(300))  // a slow answer: not the client's deadline
            Self.event(channel, .responseWritten)
            channel.embeddedEventLoop.advanceTime(by: .seconds(149))
            #expect(channel.isActive)
        }
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
        #expect(cuts.list == [.idleTimeout])
    }

    @Test("An answer sent before the request's last byte (e.g. 413) leaves the request's deadline running, then idle")
    func answeredBeforeRead() throws {
        let (channel, cuts) = try Self.channel()
        try channel.writeInbound(ByteBuffer(string: "POST / HTTP/1.1\r\n"))
        Self.event(channel, .responseWritten)
        channel.embeddedEventLoop.advanceTime(by: .seconds(20))
        Self.event(channel, .requestRead)
        channel.embeddedEventLoop.advanceTime(by: .seconds(149))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(cuts.list == [.idleTimeout])
    }

    @Test("TLS: a handshake not completed within its timeout is cut; a completed one starts the first-request deadline")
    func tlsHandshake() throws {
        let (stalled, stalledCuts) = try Self.channel(tls: true)
        try stalled.writeInbound(ByteBuffer(string: "\u{16}\u{03}\u{01}"))  // the start of a ClientHello, then nothing
        stalled.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(!stalled.isActive)
        #expect(stalledCuts.list == [.tlsHandshakeTimeout])

        let (completed, completedCuts) = try Self.channel(tls: true)
        completed.embeddedEventLoop.advanceTime(by: .seconds(5))
        Self.event(completed, .handshakeCompleted)
        completed.embeddedEventLoop.advanceTime(by: .seconds(9))
        #expect(completed.isActive)
        completed.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!completed.isActive)
        #expect(completedCuts.list == [.firstRequestTimeout])
    }

    // MARK: Making room at the maximum

    /// A connection counted in `registry` as `GuardedChildChannel` counts one, its deadlines reporting
    /// whether a request is in progress.
    static func admitted(_ registry: ConnectionRegistry) throws -> (EmbeddedChannel, ConnectionRegistry.Admission) {
        let channel = EmbeddedChannel()
        let admission = registry.admit(channel)
        try channel.pipeline.syncOperations.addHandler(ConnectionDeadlines(limits: ConnectionLimits(), tls: false, connections: registry) { _ in })
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, admission)
    }

    static func evicted(_ admission: ConnectionRegistry.Admission) -> ObjectIdentifier? {
        if case .admittedInPlaceOf(let channel) = admission { ObjectIdentifier(channel) } else { nil }
    }

    @Test("At the maximum a new connection takes the place of the one idle longest (silent, or back from a request); never of one with a request in progress")
    func longestIdleMakesRoom() throws {
        let registry = ConnectionRegistry(maximum: 3)
        let (a, _) = try Self.admitted(registry)
        let (b, _) = try Self.admitted(registry)
        let (c, _) = try Self.admitted(registry)
        // a serves a request: idle again, since now; b is the longest idle.
        try a.writeInbound(ByteBuffer(string: "GET / HTTP/1.1\r\n\r\n"))
        Self.event(a, .requestRead)
        Self.event(a, .responseWritten)
        // c's request is in progress.
        try c.writeInbound(ByteBuffer(string: "POST / HTTP/1.1\r\n"))
        let (d, forD) = try Self.admitted(registry)
        #expect(Self.evicted(forD) == ObjectIdentifier(b))
        registry.closed(b)  // its close, once done: already not counted
        #expect(registry.current == 3)
        let (e, forE) = try Self.admitted(registry)
        #expect(Self.evicted(forE) == ObjectIdentifier(a))
        // d starts a request; e is the only idle one.
        try d.writeInbound(ByteBuffer(string: "P"))
        let (f, forF) = try Self.admitted(registry)
        #expect(Self.evicted(forF) == ObjectIdentifier(e))
        try f.writeInbound(ByteBuffer(string: "P"))
        // c, d and f have requests in progress: the next is refused, and counted nowhere.
        let (_, forG) = try Self.admitted(registry)
        guard case .refused = forG else {
            Issue.record("admitted: \(forG)")
            return
        }
        #expect(registry.current == 3)
        // c's connection closes: a place is free.
        registry.closed(c)
        let (_, forH) = try Self.admitted(registry)
        guard case .admitted = forH else {
            Issue.record("not admitted plainly: \(forH)")
            return
        }
    }

    // MARK: The real server

    static func closed(_ metrics: String, _ listener: String, _ reason: String) -> Int {
        let prefix = #"siwa_connections_closed_total{listener="\#(listener)",reason="\#(reason)"} "#
        return metrics.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Int($0.dropFirst(prefix.count)) } ?? -1
    }

    /// Opens a connection whose request stays in progress: a notification POST announcing a body
    /// over 64 KiB is answered 413 at once, and the server then reads (and drops) the body, which
    /// never comes. The 413 received shows the server has seen the request.
    static func requestInProgress(port: Int) async throws -> RawConnection {
        let connection = try RawConnection(port: port)
        connection.send("POST /apple/notifications HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"payload\":\"")
        let answer = await connection.receive { $0.contains("\r\n\r\n") && $0.hasSuffix("}") }
        #expect(answer.text.hasPrefix("HTTP/1.1 413") && !answer.closed, "\(answer)")
        return connection
    }

    @Test("At the cap, 64 silent sockets do not keep a delivery out: it takes the longest-idle one's place at once")
    func silentSocketsMakeRoom() async throws {
        let h = try await Harness.start {
            $0.http.limits.maximumConnections = 64
            $0.http.limits.firstRequestTimeout = .seconds(150)  // no deadline frees a place meanwhile
        }
        var silent: [RawConnection] = []
        for count in 1...64 {
            silent.append(try RawConnection(port: h.server.port))
            // Counted one at a time (each on its event loop), so the first is the longest idle.
            await h.server.application.waitForConnections(on: .public) { $0 == count }
        }
        let answer = try await h.server.post(jws: try h.notification())
        #expect(answer.status == 200, "\(answer.body)")
        #expect(try await h.count("SELECT count(*) FROM notifications") == 1)
        let oldest = await silent[0].receive()
        #expect(oldest.closed && oldest.text.isEmpty, "\(oldest)")
        #expect(silent.dropFirst().allSatisfy { !$0.isClosedByServer })
        let metrics = try await h.server.request(.GET, "/metrics").body
        #expect(Self.closed(metrics, "public", "idle_evicted") == 1, "\(metrics.split(separator: "\n").filter { $0.contains("connections") })")
        #expect(Self.closed(metrics, "public", "over_capacity") == 0)
        for connection in silent { connection.close() }
        await h.stop()
    }

    @Test("At the cap with every connection's request in progress, a new connection is closed at once and counted; once one closes, a new one is served")
    func connectionCap() async throws {
        let h = try await Harness.start {
            $0.http.limits.maximumConnections = 2
            $0.http.limits.requestTimeout = .seconds(300)  // the requests stay in progress throughout
        }
        // One after the other: each is counted and its request begun (its 413 came) before the next.
        let first = try await Self.requestInProgress(port: h.server.port)
        let second = try await Self.requestInProgress(port: h.server.port)
        let third = try RawConnection(port: h.server.port)
        let refused = await third.receive()
        #expect(refused.closed && refused.text.isEmpty, "\(refused)")
        #expect(!first.isClosedByServer && !second.isClosedByServer)
        let metrics = try await h.server.request(.GET, "/metrics").body
        #expect(Self.closed(metrics, "public", "over_capacity") == 1, "\(metrics.split(separator: "\n").filter { $0.contains("connections") })")
        #expect(Self.closed(metrics, "public", "idle_evicted") == 0)
        #expect(metrics.contains(#"siwa_connections_open{listener="public"} 2"#))
        // The admin listener has a count of its own: the /metrics request above was served.
        // One of the two ends its connection; the server counts it on its event loop.
        first.close()
        await h.server.application.waitForConnections(on: .public) { $0 == 1 }
        let next = try RawConnection(port: h.server.port)
        next.send("GET /health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await next.receive { $0.contains("live") }.text.hasPrefix("HTTP/1.1 200"))
        second.close()
        await h.stop()
    }

    @Test("On the real server: a connection that sends nothing is closed at the first-request deadline and counted")
    func realFirstRequestDeadline() async throws {
        let h = try await Harness.start { $0.http.limits.firstRequestTimeout = .seconds(1) }
        let silent = try RawConnection(port: h.server.port)
        let answer = await silent.receive()
        #expect(answer.closed && answer.text.isEmpty, "\(answer)")
        let metrics = try await h.server.request(.GET, "/metrics").body
        #expect(Self.closed(metrics, "public", "first_request_timeout") == 1, "\(metrics.split(separator: "\n").filter { $0.contains("connections") })")
        await h.stop()
    }

    @Test("On the real server: a trickled request is cut at its deadline and stores nothing; keep-alive requests are served")
    func realServerDeadlines() async throws {
        let h = try await Harness.start {
            $0.http.limits.requestTimeout = .seconds(1)
            $0.http.limits.idleTimeout = .seconds(30)
        }
        let body = AppleStyleSigner.body(try h.notification())
        let slow = try RawConnection(port: h.server.port)
        slow.send("POST /apple/notifications HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n")
        let started = ContinuousClock.now
        var sent = 0
        // The client's own pace (one byte every 100 ms: the whole body would take minutes).
        for character in body where !slow.isClosedByServer {
            guard slow.send(String(character)) else { break }
            sent += 1
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(sent < body.utf8.count, "the whole body went through")
        #expect(ContinuousClock.now - started >= .seconds(1))
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        let metrics = try await h.server.request(.GET, "/metrics").body
        #expect(Self.closed(metrics, "public", "request_timeout") == 1)

        // Keep-alive: two requests on one connection, apart longer than the request deadline.
        let keepAlive = try RawConnection(port: h.server.port)
        for round in 0..<2 {
            #expect(keepAlive.send("GET /health/live HTTP/1.1\r\nHost: t\r\n\r\n"), "round \(round)")
            let answer = await keepAlive.receive { $0.contains("live") }
            #expect(answer.text.hasPrefix("HTTP/1.1 200") && !answer.closed, "round \(round): \(answer)")
            // The pause under test: longer than the 1 s request deadline, shorter than the idle one.
            if round == 0 { try await Task.sleep(for: .milliseconds(1_500)) }
        }
        await h.stop()
    }

    @Test("Serving TLS: a connection that never completes its handshake is cut at the handshake deadline and counted")
    func realTLSHandshakeDeadline() async throws {
        let directory = "/tmp/siwa-tls-\(UUID().uuidString.prefix(6).lowercased())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let generated = try await Subprocess.run(
            "/usr/bin/env",
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "\(directory)/tls.key", "-out", "\(directory)/tls.pem",
             "-days", "7", "-subj", "/CN=localhost"],
            environment: ProcessInfo.processInfo.environment)
        #expect(generated.succeeded, "\(generated.combinedOutput)")
        let h = try await Harness.start {
            $0.http.tlsCertificateFile = "\(directory)/tls.pem"
            $0.http.tlsKeyFile = "\(directory)/tls.key"
            $0.http.limits.tlsHandshakeTimeout = .seconds(1)
        }
        let stalled = try RawConnection(port: h.server.port)
        stalled.send("\u{16}\u{03}\u{01}")  // the start of a ClientHello, then nothing
        let started = ContinuousClock.now
        let answer = await stalled.receive()
        #expect(answer.closed)
        #expect(ContinuousClock.now - started >= .milliseconds(900))
        let metrics = try await h.server.request(.GET, "/metrics").body
        #expect(Self.closed(metrics, "public", "tls_handshake_timeout") == 1)
        await h.stop()
    }

    // MARK: Two listeners

    @Test("The public listener serves only the notification route and health; the admin one the API, dashboard, contract and metrics")
    func listeners() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.notificationsRead])
        for path in ["/v1/notifications", "/metrics", "/", "/app.js", "/openapi.yaml"] {
            let answer = try await HTTPClientRequestBuilder.get(h.server.baseURL + path, bearer: token)
            #expect(answer == 404, "public \(path)")
        }
        #expect(try await HTTPClientRequestBuilder.get(h.server.baseURL + "/health/ready") == 200)
        #expect(try await h.server.post(jws: try h.notification()).status == 200)
        for path in ["/v1/notifications", "/metrics", "/", "/openapi.yaml", "/health/live"] {
            #expect(try await HTTPClientRequestBuilder.get(h.server.adminBaseURL + path, bearer: token) == 200, "admin \(path)")
        }
        var post = HTTPClientRequestBuilder.post(h.server.adminBaseURL + "/apple/notifications", body: AppleStyleSigner.body(try h.notification()))
        #expect(try await post.send() == 404)
        await h.stop()
    }
}
