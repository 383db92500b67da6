import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS
import Logging
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaStore

/// `healthcheck`: the container's HEALTHCHECK (the runtime image has no curl). Exit 0 when the URL
/// answers 200, 1 otherwise; the answer's body is printed either way.
struct Healthcheck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "GET a health route of a running siwa-events (exit 0 when it answers 200): the container's HEALTHCHECK.",
        discussion: """
            Examples:
              siwa-events healthcheck
              siwa-events healthcheck --url http://127.0.0.1:8080/health/live --timeout 2s
            """)

    @Option(help: "The route to ask. Default: http://127.0.0.1:$SIWA_PORT/health/ready.")
    var url: String?
    @Option(help: "How long to wait for the answer, e.g. 3s.")
    var timeout: String = "3s"

    func run() async throws {
        let port = ProcessInfo.processInfo.environment["SIWA_PORT"] ?? "8080"
        let target = url ?? "http://127.0.0.1:\(port)/health/ready"
        guard let limit = try? DurationSyntax.parse(timeout) else { throw ValidationError("--timeout: \"\(timeout)\" is not a duration such as 3s") }
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: .init(redirectConfiguration: .disallow))
        let status: HTTPResponseStatus
        do {
            let response = try await http.execute(HTTPClientRequest(url: target), timeout: .nanoseconds(Int64(limit.nanoseconds)))
            let body = try await response.body.collect(upTo: 64 * 1024)
            print(String(buffer: body))
            status = response.status
        } catch {
            try? await http.shutdown()
            printError("healthcheck: \(target): \(error)")
            throw ExitCode.failure
        }
        try? await http.shutdown()
        if status != .ok { throw ExitCode.failure }
    }
}

/// `doctor --url https://…`: checks, from where it runs, what Apple needs to deliver to the
/// endpoint: the name resolves (to a public address), TLS 1.2+ with a publicly trusted chain for
/// that name, and the route answers a malformed notification with siwa-events' 400 JSON — not a
/// 404 (wrong path or proxy), a redirect, a 5xx, or a 2xx (something that accepts anything).
struct Doctor: SettingsCommand {
    static let settingGroups: [SettingGroup] = [.database, .apple, .appleCredentials, .logging]
    static let configuration = CommandConfiguration(
        abstract: "Check an endpoint the way Apple will call it: DNS, TLS version and certificate chain, and the route.",
        discussion: """
            Prints one line per check (ok, warn, FAIL) and exits 0 when nothing failed, 1 otherwise. \
            The route check POSTs a malformed notification ({"siwa_events_doctor": …}, no payload): \
            siwa-events answers 400 JSON and records it as a rejection (reason malformed_request); nothing is accepted. \
            With DATABASE_URL (or an embedded database here) it also checks the database role: \
            connected as a superuser is a failure. With SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and \
            SIWA_APPLE_PRIVATE_KEY_FILE it checks that Apple accepts their client secret for each of \
            SIWA_APPLE_BUNDLE_IDS, with one harmless call (revoking a token that does not exist).

            Examples:
              siwa-events doctor --url https://siwa.example.com/apple/notifications
              siwa-events doctor --url https://$HOST/apple/notifications --ca-file ca.pem
            """)

    @Option(help: "The URL registered with Apple, e.g. https://siwa.example.com/apple/notifications.")
    var url: String
    @Option(name: .customLong("ca-file"), help: "Also trust this PEM CA certificate (a staging CA; Apple trusts only public CAs, so it is a warning).")
    var caFile: String?
    @Option(help: "Limit of each network check, e.g. 10s.")
    var timeout: String = "10s"

    func run(_ settings: SettingSource) async throws {
        guard let endpoint = URL(string: url), let scheme = endpoint.scheme?.lowercased(), ["https", "http"].contains(scheme),
            let host = endpoint.host, !host.isEmpty
        else {
            throw ValidationError("--url: \"\(url)\" is not an https:// URL such as https://siwa.example.com/apple/notifications")
        }
        guard let limit = try? DurationSyntax.parse(timeout) else { throw ValidationError("--timeout: \"\(timeout)\" is not a duration such as 10s") }
        var report = DoctorReport()
        let port = endpoint.port ?? (scheme == "https" ? 443 : 80)

        if scheme == "https" {
            report.ok("url", "\(url)")
        } else {
            report.fail("url", "\(url) is http://: Apple delivers only to https:// (TLS 1.2+, a publicly trusted certificate); checking the rest anyway")
        }
        if endpoint.path.isEmpty || endpoint.path == "/" {
            report.warn("url", "no path: siwa-events receives on /apple/notifications")
        }

        // DNS
        let addresses = Self.resolve(host)
        if addresses.isEmpty {
            report.fail("dns", "\(host) does not resolve: add an A/AAAA record for it")
        } else if addresses.allSatisfy(Self.isPrivate) {
            report.warn("dns", "\(host) → \(addresses.joined(separator: ", ")): only private or loopback addresses, which Apple cannot reach")
        } else {
            report.ok("dns", "\(host) → \(addresses.joined(separator: ", "))")
        }

        // TLS
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let caFile {
            do {
                tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMFile(caFile))]
                report.warn("tls", "also trusting \(caFile): Apple trusts only publicly trusted CAs")
            } catch {
                throw ValidationError("--ca-file: cannot read \(caFile) as PEM certificates: \(error)")
            }
        }
        if scheme == "https", !addresses.isEmpty {
            do {
                let session = try await Self.handshake(host: host, port: port, tls: tls, timeout: limit)
                let expiry = Date(timeIntervalSince1970: TimeInterval(session.notValidAfter))
                let days = Int(expiry.timeIntervalSinceNow / 86_400)
                report.ok("tls", "\(session.version), certificate chain trusted for \(host), valid until \(iso8601(expiry)) (\(days) days)")
                if days < 14 { report.warn("tls", "the certificate expires in \(days) days: renew it (Apple's deliveries fail the moment it expires)") }
            } catch let error as NIOSSLError {
                report.fail("tls", "handshake with \(host):\(port) failed (TLS 1.2+, full chain verification): \(error) — serve the full chain of a publicly trusted certificate for \(host)")
            } catch {
                report.fail("tls", "cannot connect to \(host):\(port): \(error) — is the port open to the internet, and is something listening?")
            }
        }

        // Route
        do {
            let (status, contentType, body) = try await Self.postMalformed(to: endpoint, tls: tls, timeout: limit)
            let json = JSONValue.parse(Array(body.utf8))
            switch status {
            case 400 where contentType.hasPrefix("application/json") && json?["error"] != nil:
                report.ok("route", "POST \(endpoint.path) with a malformed notification → 400 \(body.prefix(120))")
            case 404, 405:
                report.fail("route", "POST \(endpoint.path) → \(status): not siwa-events' route; the path is /apple/notifications and the proxy must pass POSTs through")
            case 300..<400:
                report.fail("route", "POST \(endpoint.path) → \(status) redirect: register the final URL with Apple, it must answer directly")
            case 200..<300:
                report.fail("route", "POST \(endpoint.path) → \(status) for a malformed notification: whatever answers accepts anything — not siwa-events")
            case 500...:
                report.fail("route", "POST \(endpoint.path) → \(status): the server or its proxy fails (\(body.prefix(200))); see its logs and /health/ready")
            default:
                report.fail("route", "POST \(endpoint.path) → \(status) \(contentType) \(body.prefix(200)): expected siwa-events' 400 JSON")
            }
        } catch {
            report.fail("route", "POST \(url) failed: \(error)")
        }

        await checkDatabase(&report, settings)
        await checkAppleCredentials(&report, settings, timeout: limit)

        for line in report.lines { print(line) }
        if report.failed {
            printError("doctor: \(report.failures) check(s) failed")
            throw ExitCode.failure
        }
    }

    /// The credentials for Apple's auth endpoints: a revoke of a token that does not exist is
    /// answered 200 when Apple accepts the client secret, `invalid_client` when it does not.
    func checkAppleCredentials(_ report: inout DoctorReport, _ settings: SettingSource, timeout: Duration) async {
        let credentials: AppleCredentials?
        let clientIDs: [String]
        do {
            credentials = try AppleCredentials.configured(settings)
            clientIDs = try settings.value(Settings.bundleIDs)
        } catch {
            report.fail("apple-credentials", error.description)
            return
        }
        guard let credentials else { return }
        guard !clientIDs.isEmpty else {
            report.fail("apple-credentials", "set SIWA_APPLE_BUNDLE_IDS: the client secret is checked for each bundle ID")
            return
        }
        let client = credentials.client(timeout: timeout)
        for clientID in clientIDs.prefix(5) {
            let call = await client.revoke(token: "siwa-events-doctor-\(UUID().uuidString)", hint: .accessToken, clientID: clientID)
            let who = "team \(credentials.policy.teamID), key \(credentials.key.keyID), client \(clientID)"
            switch call.result {
            case .success:
                report.ok("apple-credentials", "\(credentials.authURL.absoluteString) accepted the client secret (\(who))")
            case .failure(.apple(.invalidClient)):
                report.fail(
                    "apple-credentials",
                    "Apple refused the client secret (invalid_client; \(who)): check the team ID, the key ID, that the .p8 is that key's, and that the key is enabled for Sign in with Apple on \(clientID)'s primary App ID")
            case .failure(let failure):
                report.fail("apple-credentials", "\(failure) (\(who))")
            }
        }
    }

    /// The database the service would use: reachable, and not as a superuser.
    func checkDatabase(_ report: inout DoctorReport, _ settings: SettingSource) async {
        let database: DatabaseSettings
        do {
            database = try DatabaseSettings(settings)
        } catch {
            printError("siwa-events: \(error.description)")
            report.fail("database", "the database settings are invalid (see above)")
            return
        }
        let logger = (try? makeLogger(settings)) ?? Logger(label: "siwa-events")
        do {
            let role = try await Database.with(database, logger: logger) { database in
                (try await ConnectedRole.read(database.client, logger: logger), database.description)
            }
            if let url = database.url, let warning = DatabaseURL.transportWarning(url) { report.warn("database", warning) }
            if let problem = role.0.superuserProblem {
                report.fail("database", "\(role.1): \(problem)")
            } else {
                report.ok("database", "\(role.1): connected as \(role.0.name), not a superuser")
            }
        } catch let error as ConfigurationError where database.url == nil {
            report.warn("database", "not checked: \(error.description)")
        } catch {
            report.fail("database", "\(error)")
        }
    }

    static func resolve(_ host: String) -> [String] {
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
        let channel = try await ClientBootstrap(group: group)
            .connectTimeout(.nanoseconds(Int64(timeout.nanoseconds)))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: Self.resolve(host) == [host] ? nil : host))
                    try channel.pipeline.syncOperations.addHandler(HandshakeWaiter())
                }
            }
            .connect(host: host, port: port).get()
        defer { channel.close(promise: nil) }
        let waiter = try await channel.pipeline.handler(type: HandshakeWaiter.self).get()
        let deadline = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(timeout.nanoseconds))) {
            waiter.complete(.failure(ChannelError.connectTimeout(.nanoseconds(Int64(timeout.nanoseconds)))))
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
        configuration.timeout = .init(connect: .nanoseconds(Int64(timeout.nanoseconds)), read: .nanoseconds(Int64(timeout.nanoseconds)))
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
        do {
            var request = HTTPClientRequest(url: url.absoluteString)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.headers.add(name: "User-Agent", value: "siwa-events-doctor")
            request.body = .bytes(ByteBuffer(string: #"{"siwa_events_doctor":"a malformed notification: no payload"}"#))
            let response = try await http.execute(request, timeout: .nanoseconds(Int64(timeout.nanoseconds)))
            let body = try await response.body.collect(upTo: 64 * 1024)
            try await http.shutdown()
            return (Int(response.status.code), response.headers.first(name: "Content-Type") ?? "", String(buffer: body))
        } catch {
            try? await http.shutdown()
            throw error
        }
    }
}

/// The doctor's findings, one line each.
struct DoctorReport {
    private(set) var lines: [String] = []
    private(set) var failures = 0
    var failed: Bool { failures > 0 }

    mutating func ok(_ check: String, _ text: String) { lines.append("ok    \(check): \(text)") }
    mutating func warn(_ check: String, _ text: String) { lines.append("warn  \(check): \(text)") }
    mutating func fail(_ check: String, _ text: String) {
        failures += 1
        lines.append("FAIL  \(check): \(text)")
    }
}


extension Duration {
    fileprivate var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
