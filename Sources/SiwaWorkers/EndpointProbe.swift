import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS
import SiwaDomain

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Checks an endpoint the way Apple will call it: the URL, DNS, a TLS 1.2+ handshake with full
/// chain verification for the name (and the leaf's expiry), and the route answering a malformed
/// notification with siwa-events' own 400 JSON. One home for `siwa-events doctor` and the
/// background `EndpointChecker`, so both judge alike; the findings' words are doctor's lines.
package struct EndpointProbe: Sendable {
    /// The URL is not an http(s) URL with a host.
    package struct NotAWebURL: Error {}

    package let text: String
    package let url: URL
    let scheme: String
    let host: String
    let port: Int
    package var timeout: Duration
    /// The certificate is warned about at fewer days left than this.
    package var expiryWarningDays: Int
    private(set) var tls: TLSConfiguration
    private(set) var caFile: String?

    package init(url text: String, timeout: Duration = .seconds(10), expiryWarningDays: Int = 14) throws(NotAWebURL) {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), ["https", "http"].contains(scheme), let host = url.host, !host.isEmpty else {
            throw NotAWebURL()
        }
        // The URL as findings quote it: without its userinfo (they reach /health and the logs).
        (self.text, self.url, self.scheme, self.host) = (URLRedaction.scrubbed(text), url, scheme, host)
        self.port = url.port ?? (scheme == "https" ? 443 : 80)
        self.timeout = timeout
        self.expiryWarningDays = expiryWarningDays
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        self.tls = tls
    }

    /// Also trusts the PEM CA certificates of `file` (a staging CA; a warning, since Apple trusts
    /// only publicly trusted CAs). Throws NIOSSL's error when the file is not PEM certificates.
    package mutating func trust(caFile file: String) throws {
        tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMFile(file))]
        caFile = file
    }

    /// Runs every check once; `now` counts the certificate's days left.
    package func check(now: Date) async -> EndpointReport {
        var findings = urlFindings()
        let addresses = await Self.resolve(host)
        findings.append(dnsFinding(addresses))
        if let caFile { findings.append(.init(.tls, .warn, "also trusting \(caFile): Apple trusts only publicly trusted CAs")) }
        var expiresAt: Date?
        if scheme == "https", !addresses.isEmpty {
            let tls = await tlsFindings(now: now)
            findings += tls.findings
            expiresAt = tls.expiresAt
        }
        // Over a handshake that failed the POST cannot get through either, and the HTTP client
        // would retry the connection until the timeout: it is not sent.
        if findings.contains(where: { $0.check == .tls && $0.level == .fail }) {
            findings.append(.init(.route, .fail, "POST \(url.path) not sent: the TLS handshake failed (above)"))
        } else {
            findings.append(await routeFinding())
        }
        return EndpointReport(url: text, checkedAt: now, findings: findings, certificateExpiresAt: expiresAt)
    }

    /// The URL: https, and a path.
    func urlFindings() -> [EndpointFinding] {
        var findings: [EndpointFinding] = []
        if scheme == "https" {
            findings.append(.init(.url, .ok, text))
        } else {
            findings.append(.init(.url, .fail, "\(text) is http://: Apple delivers only to https:// (TLS 1.2+, a publicly trusted certificate); checking the rest anyway"))
        }
        if url.path.isEmpty || url.path == "/" {
            findings.append(.init(.url, .warn, "no path: siwa-events receives on /apple/notifications"))
        }
        return findings
    }

    /// The host resolves, and to an address Apple can reach.
    func dnsFinding(_ addresses: [String]) -> EndpointFinding {
        if addresses.isEmpty {
            .init(.dns, .fail, "\(host) does not resolve: add an A/AAAA record for it")
        } else if addresses.allSatisfy(Self.isPrivate) {
            .init(.dns, .warn, "\(host) → \(addresses.joined(separator: ", ")): only private or loopback addresses, which Apple cannot reach")
        } else {
            .init(.dns, .ok, "\(host) → \(addresses.joined(separator: ", "))")
        }
    }

    /// A TLS 1.2+ handshake with full chain verification, and the certificate's days left.
    func tlsFindings(now: Date) async -> (findings: [EndpointFinding], expiresAt: Date?) {
        do {
            let session = try await Self.handshake(host: host, port: port, tls: tls, timeout: timeout)
            let expiry = Date(timeIntervalSince1970: TimeInterval(session.notValidAfter))
            let days = EndpointHealthRule.days(until: expiry, now: now)
            var findings: [EndpointFinding] = [
                .init(.tls, .ok, "\(session.version), certificate chain trusted for \(host), valid until \(iso8601(expiry)) (\(days) days)")
            ]
            if days < expiryWarningDays {
                findings.append(.init(.tls, .warn, "the certificate expires in \(days) days: renew it (Apple's deliveries fail the moment it expires)"))
            }
            return (findings, expiry)
        } catch where error is NIOSSLError || error is NIOSSLExtraError {
            // NIOSSLExtraError: the chain is trusted, but not for this name.
            return ([
                .init(
                    .tls, .fail,
                    "handshake with \(host):\(port) failed (TLS 1.2+, full chain verification): \(error) — serve the full chain of a publicly trusted certificate for \(host)")
            ], nil)
        } catch {
            return ([.init(.tls, .fail, "cannot connect to \(host):\(port): \(Self.plainWords(error)) — is the port open to the internet, and is something listening?")], nil)
        }
    }

    /// The route answers a malformed notification with siwa-events' own 400 JSON.
    func routeFinding() async -> EndpointFinding {
        let path = url.path
        let status: Int
        let contentType: String
        let body: String
        do {
            (status, contentType, body) = try await Self.postMalformed(to: url, tls: tls, timeout: timeout)
        } catch {
            return .init(.route, .fail, "POST \(text) failed: \(Self.plainWords(error))")
        }
        let json = JSONValue.parse(Array(body.utf8))
        return switch status {
        case 400 where contentType.hasPrefix("application/json") && json?["error"] != nil:
            .init(.route, .ok, "POST \(path) with a malformed notification → 400 \(body.prefix(120))")
        case 404, 405:
            .init(.route, .fail, "POST \(path) → \(status): not siwa-events' route; the path is /apple/notifications and the proxy must pass POSTs through")
        case 300..<400:
            .init(.route, .fail, "POST \(path) → \(status) redirect: register the final URL with Apple, it must answer directly")
        case 200..<300:
            .init(.route, .fail, "POST \(path) → \(status) for a malformed notification: whatever answers accepts anything — not siwa-events")
        case 500...:
            .init(.route, .fail, "POST \(path) → \(status): the server or its proxy fails (\(body.prefix(200))); see its logs and /health/ready")
        default:
            .init(.route, .fail, "POST \(path) → \(status) \(contentType) \(body.prefix(200)): expected siwa-events' 400 JSON")
        }
    }

    /// The host's addresses, numeric, without duplicates; none when it does not resolve.
    /// `getaddrinfo` blocks for as long as the resolver takes (its whole timeout when DNS hangs):
    /// it runs on a thread of NIO's pool, never on an event loop, which in `serve` is also Swift
    /// concurrency's executor (a lookup there stalls both listeners).
    static func resolve(_ host: String) async -> [String] {
        // The singleton pool is never shut down: `runIfActive` does not fail.
        (try? await NIOThreadPool.singleton.runIfActive { lookUp(host) }) ?? []
    }

    /// `resolve`'s blocking lookup.
    private static func lookUp(_ host: String) -> [String] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &result) == 0, let first = result else { return [] }
        defer { freeaddrinfo(first) }
        var addresses: [String] = []
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let info = cursor {
            var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            if getnameinfo(info.pointee.ai_addr, info.pointee.ai_addrlen, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST) == 0 {
                let address = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                if !addresses.contains(address) { addresses.append(address) }
            }
            cursor = info.pointee.ai_next
        }
        return addresses
    }

    /// Loopback, private (RFC 1918, ULA), link-local or unspecified.
    static func isPrivate(_ address: String) -> Bool {
        if address.contains(":") {
            let lower = address.lowercased()
            return lower == "::1" || lower == "::" || lower.hasPrefix("fc") || lower.hasPrefix("fd") || lower.hasPrefix("fe80")
        }
        let octets = address.split(separator: ".").compactMap { Int($0) }
        guard octets.count == 4 else { return false }
        switch (octets[0], octets[1]) {
        case (10, _), (127, _), (0, _), (169, 254), (192, 168): return true
        case (172, 16...31): return true
        case (100, 64...127): return true  // carrier-grade NAT
        default: return false
        }
    }

    struct Session { var version: String; var notValidAfter: time_t }

    /// A TLS handshake only: the negotiated version and the leaf's expiry.
    static func handshake(host: String, port: Int, tls: TLSConfiguration, timeout: Duration) async throws -> Session {
        let context = try NIOSSLContext(configuration: tls)
        let group = MultiThreadedEventLoopGroup.singleton
        let serverHostname = await Self.resolve(host) == [host] ? nil : host
        // The waiter comes back from the initializer, not from a pipeline lookup after connect: a
        // handshake that fails at once closes the channel and empties its pipeline first.
        let (channel, waiter) = try await ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(timeout.nanoseconds))
            .connect(host: host, port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: serverHostname))
                    let waiter = HandshakeWaiter()
                    try channel.pipeline.syncOperations.addHandler(waiter)
                    return (channel, waiter)
                }
            }
        defer { channel.close(promise: nil) }
        let deadline = channel.eventLoop.scheduleTask(in: .nanoseconds(timeout.nanoseconds)) {
            waiter.complete(.failure(ChannelError.connectTimeout(.nanoseconds(timeout.nanoseconds))))
        }
        defer { deadline.cancel() }
        try await waiter.promise.futureResult.get()
        let version = try await channel.nioSSL_tlsVersion().get()
        let certificate = try await channel.nioSSL_peerCertificate().get()
        return Session(version: version.map(Self.name) ?? "unknown TLS version", notValidAfter: certificate?.notValidAfter ?? 0)
    }

    static func name(_ version: TLSVersion) -> String {
        switch version {
        case .tlsv1: "TLS 1.0"
        case .tlsv11: "TLS 1.1"
        case .tlsv12: "TLS 1.2"
        case .tlsv13: "TLS 1.3"
        }
    }

    /// Completes its promise when the handshake does, fails it with the handshake's error.
    final class HandshakeWaiter: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var promise: EventLoopPromise<Void>!
        /// A promise completes once: the first of handshake, error, close or timeout wins.
        private var completed = false

        func handlerAdded(context: ChannelHandlerContext) { promise = context.eventLoop.makePromise() }
        /// The connection failed before it was active (refused, unreachable): nobody waits, but the
        /// promise must not be dropped uncompleted.
        func handlerRemoved(context: ChannelHandlerContext) { complete(.failure(ChannelError.ioOnClosedChannel)) }
        func complete(_ result: Result<Void, any Error>) {
            guard !completed else { return }
            completed = true
            promise.completeWith(result)
        }
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent { complete(.success(())) }
            context.fireUserInboundEventTriggered(event)
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { complete(.failure(error)) }
        func channelInactive(context: ChannelHandlerContext) {
            complete(.failure(ChannelError.eof))
            context.fireChannelInactive()
        }
    }

    static func postMalformed(to url: URL, tls: TLSConfiguration, timeout: Duration) async throws -> (Int, String, String) {
        var configuration = HTTPClient.Configuration(tlsConfiguration: tls, redirectConfiguration: .disallow)
        configuration.timeout = .init(connect: .nanoseconds(timeout.nanoseconds), read: .nanoseconds(timeout.nanoseconds))
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
        do {
            var request = HTTPClientRequest(url: url.absoluteString)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.headers.add(name: "User-Agent", value: "siwa-events-doctor")
            request.body = .bytes(ByteBuffer(string: #"{"siwa_events_doctor":"a malformed notification: no payload"}"#))
            let response = try await http.execute(request, timeout: .nanoseconds(timeout.nanoseconds))
            let body = try await response.body.collect(upTo: 64 * 1024)
            try await http.shutdown()
            return (Int(response.status.code), response.headers.first(name: "Content-Type") ?? "", String(buffer: body))
        } catch {
            try? await http.shutdown()
            throw error
        }
    }
}

extension EndpointProbe {
    /// A network library's error said for people first (what happened), its own text after it in
    /// brackets and cut, for whoever debugs: `SingleConnectionFailure … errno: 111` becomes "the
    /// connection was refused (…)".
    static func plainWords(_ error: any Error) -> String {
        let raw = "\(error)"
        let said: String =
            if raw.contains("errno: 111") || raw.contains("connectionRefused") { "the connection was refused: nothing listens on that port, or a firewall rejects it" }
            else if raw.contains("errno: 113") || raw.contains("errno: 101") { "no route to the host: a firewall or the network drops the packets" }
            else if raw.contains("errno: 110") || raw.localizedCaseInsensitiveContains("timeout") || raw.contains("deadline") { "no answer in time" }
            else if raw.contains("errno: 104") || raw.contains("remoteConnectionClosed") { "the server closed the connection" }
            else { "the connection failed" }
        return "\(said) (\(UntrustedText.bounded(raw, limit: 160)))"
    }
}

extension Duration {
    fileprivate var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
