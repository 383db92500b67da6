import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import SiwaDomain
import Synchronization

/// DATABASE_URL's TCP hosts behind a private unix socket that postgres-nio's pool connects to (it
/// takes one host, no socket options): each connection goes to the first host that answers, from
/// the last good one, with keepalive and `TCP_USER_TIMEOUT` (`Liveness`). A statement unanswered
/// for `stallAfter` gets its host probed; a silent host is left. `read-write` drops a standby at
/// start-up. TLS is the relay's. docs/operations.md, "HA / failover", says what users rely on.
package final class DatabaseRelay: Sendable {
    package struct Liveness: Sendable {
        package var connectTimeout: Duration = .seconds(5)
        package var keepaliveIdle: Duration = .seconds(5)
        package var keepaliveInterval: Duration = .seconds(2)
        package var keepaliveCount = 3
        package var userTimeout: Duration = .seconds(10)
        package var stallAfter: Duration = .seconds(2)
        package var probeTimeout: Duration = .seconds(3)

        package init() {}
    }

    package let hosts: [DatabaseHost]
    let tls: DatabaseURL.Target.TLSMode
    let attributes: DatabaseURL.SessionAttributes
    let liveness: Liveness
    let logger: Logger
    /// The socket postgres-nio connects to.
    package let socketPath: String
    private let directory: String
    private let group: any EventLoopGroup
    private let sslContext: NIOSSLContext?
    private let state = Mutex(State())

    private struct State {
        /// Where the next connection starts looking.
        var preferred = 0
        /// Relayed connections open, per host index.
        var open: [Int: [ObjectIdentifier: Pair]] = [:]
        /// Per host index, how many times it was found dead: a connection made before that (and
        /// registered in `open` after the closing swept it) is closed when it registers.
        var deaths: [Int: Int] = [:]
        var probing: Set<Int> = []
        var server: (any Channel)?
    }

    package init(
        hosts: [DatabaseHost], tls: DatabaseURL.Target.TLSMode, attributes: DatabaseURL.SessionAttributes, liveness: Liveness = Liveness(),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton, logger: Logger
    ) throws {
        precondition(!hosts.isEmpty)
        self.hosts = hosts
        self.tls = tls
        self.attributes = attributes
        self.liveness = liveness
        self.group = group
        self.logger = logger
        sslContext = tls == .disable ? nil : try NIOSSLContext(configuration: .makeClientConfiguration())
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-relay-\(getpid())-\(UUID().uuidString.prefix(8))").path
        socketPath = "\(directory)/.s.PGSQL.5432"
    }

    /// The host connections go to now.
    package var currentHost: DatabaseHost { hosts[state.withLock { $0.preferred }] }

    /// Binds the socket; connections are relayed from then on, until `stop`.
    package func start() async throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { [self] inbound in
                Task { await self.relay(inbound) }
                return inbound.eventLoop.makeSucceededVoidFuture()
            }
            .bind(unixDomainSocketPath: socketPath, cleanupExistingSocketFile: true).get()
        state.withLock { $0.server = server }
    }

    /// Closes the socket and every relayed connection.
    package func stop() async {
        let (server, open) = state.withLock { state in
            defer { (state.server, state.open) = (nil, [:]) }
            return (state.server, state.open.values.flatMap(\.values))
        }
        try? await server?.close()
        for pair in open { pair.end(because: "siwa-events is stopping") }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Connects `inbound` to the first host that takes it, from the preferred one on.
    private func relay(_ inbound: any Channel) async {
        let (first, deaths) = state.withLock { ($0.preferred, $0.deaths) }
        var reasons: [String] = []
        for step in 0..<hosts.count {
            let index = (first + step) % hosts.count
            do {
                let upstream = try await connect(index, on: inbound.eventLoop)
                do {
                    try await join(inbound, upstream, host: index, deaths: deaths[index, default: 0])
                    logger.debug("relaying", metadata: ["host": "\(hosts[index])", "deaths": "\(deaths[index, default: 0])"])
                    return
                } catch {
                    upstream.close(promise: nil)
                    throw error
                }
            } catch {
                reasons.append("\(hosts[index]): \(DatabaseProbe.reason(error))")
                leave(index, because: DatabaseProbe.reason(error))
            }
        }
        logger.warning("no database host of DATABASE_URL took the connection", metadata: ["hosts": "\(reasons.joined(separator: "; "))"])
        inbound.close(promise: nil)
    }

    /// A TCP connection to host `index` with the liveness options, TLS negotiated per `sslmode`.
    private func connect(_ index: Int, on eventLoop: any EventLoop, timeout: Duration? = nil) async throws -> any Channel {
        let host = hosts[index]
        let channel = try await Self.bootstrap(on: eventLoop, liveness: liveness, timeout: timeout ?? liveness.connectTimeout)
            .connect(host: host.name, port: host.port).get()
        guard let sslContext else { return channel }
        do {
            let answer = try await Self.sslRequest(channel, timeout: timeout ?? liveness.connectTimeout)
            if answer == UInt8(ascii: "S") {
                let serverName = host.name.first?.isLetter == true ? host.name : nil
                try await channel.eventLoop.submit {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: sslContext, serverHostname: serverName))
                }.get()
            } else if tls == .require {
                throw RelayError.tlsRefused
            }
            return channel
        } catch {
            channel.close(promise: nil)
            throw error
        }
    }

    static func bootstrap(on eventLoop: any EventLoop, liveness: Liveness, timeout: Duration) -> ClientBootstrap {
        var bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(.milliseconds(timeout.milliseconds))
            .channelOption(.socketOption(.so_keepalive), value: 1)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
        #if os(Linux)
            // Linux's option names (netinet/tcp.h): TCP_KEEPIDLE 4, TCP_KEEPINTVL 5, TCP_KEEPCNT 6, TCP_USER_TIMEOUT 18.
            let tcp = NIOBSDSocket.OptionLevel.tcp
            for (name, value) in [
                (4, Int(liveness.keepaliveIdle.milliseconds / 1000)), (5, Int(liveness.keepaliveInterval.milliseconds / 1000)),
                (6, liveness.keepaliveCount), (18, Int(liveness.userTimeout.milliseconds)),
            ] {
                bootstrap = bootstrap.channelOption(ChannelOptions.Types.SocketOption(level: tcp, name: NIOBSDSocket.Option(rawValue: CInt(name))), value: SocketOptionValue(value))
            }
        #endif
        return bootstrap
    }

    /// PostgreSQL's SSLRequest; the postmaster's one-byte answer (`S` or `N`), within `timeout`.
    static func sslRequest(_ channel: any Channel, timeout: Duration) async throws -> UInt8 {
        let promise = channel.eventLoop.makePromise(of: UInt8.self)
        try await channel.eventLoop.submit {
            try channel.pipeline.syncOperations.addHandler(FirstByte(promise: promise), name: "first-byte")
        }.get()
        let deadline = channel.eventLoop.scheduleTask(in: .milliseconds(timeout.milliseconds)) { promise.fail(RelayError.noAnswer(timeout)) }
        var request = channel.allocator.buffer(capacity: 8)
        request.writeInteger(Int32(8))
        request.writeInteger(Int32(80_877_103))
        channel.writeAndFlush(request, promise: nil)
        defer { deadline.cancel() }
        let answer = try await promise.futureResult.get()
        _ = try? await channel.pipeline.removeHandler(name: "first-byte").get()
        return answer
    }

    /// Joins the two channels (on one event loop) and lets the client's bytes flow.
    private func join(_ inbound: any Channel, _ upstream: any Channel, host index: Int, deaths: Int) async throws {
        let attributes = self.attributes
        let onStall: @Sendable () -> Void = { [self] in suspect(index) }
        let onRefused: @Sendable (String) -> Void = { [self] reason in leave(index, because: reason) }
        try await inbound.eventLoop.flatSubmit { () -> EventLoopFuture<Void> in
            let exchange = Exchange(eventLoop: inbound.eventLoop, stallAfter: .milliseconds(self.liveness.stallAfter.milliseconds), onStall: onStall)
            let client = RelayHalf(side: .client, exchange: exchange)
            let server = RelayHalf(side: .server, exchange: exchange)
            client.partner = server
            server.partner = client
            do {
                try upstream.pipeline.syncOperations.addHandler(StartupCheck(attributes: attributes, onRefused: onRefused))
                try upstream.pipeline.syncOperations.addHandler(server)
                try inbound.pipeline.syncOperations.addHandler(client)
            } catch {
                return inbound.eventLoop.makeFailedFuture(error)
            }
            return inbound.setOption(.autoRead, value: true)
        }.get()
        let id = ObjectIdentifier(upstream)
        let stale = state.withLock { state -> Bool in
            guard state.deaths[index, default: 0] == deaths else { return true }
            state.open[index, default: [:]][id] = Pair(client: inbound, server: upstream)
            return false
        }
        if stale {
            logger.debug("stale", metadata: ["host": "\(hosts[index])"])
            upstream.close(promise: nil)
        }
        // The relay halves end each side when the other goes (the client told why first).
        upstream.closeFuture.whenComplete { [self] _ in
            state.withLock { _ = $0.open[index]?.removeValue(forKey: id) }
        }
        inbound.closeFuture.whenComplete { _ in upstream.close(promise: nil) }
    }

    /// Host `index` failed (no connection, a read-only server, no answer to a probe): the next
    /// connection starts at the host after it.
    private func leave(_ index: Int, because reason: String) {
        let moved = state.withLock { state -> Bool in
            guard state.preferred == index, hosts.count > 1 else { return false }
            state.preferred = (index + 1) % hosts.count
            return true
        }
        if moved {
            logger.warning(
                "database host left; connections go to the next host of DATABASE_URL",
                metadata: ["host": "\(hosts[index])", "reason": "\(reason)", "next": "\(currentHost)"])
        }
    }

    /// A statement on host `index` waits: is the host still there? One probe at a time per host.
    private func suspect(_ index: Int) {
        logger.debug("suspect", metadata: ["host": "\(hosts[index])"])
        guard state.withLock({ $0.probing.insert(index).inserted }) else { return }
        Task {
            let alive: Bool
            do {
                let channel = try await connect(index, on: group.any(), timeout: liveness.probeTimeout, plain: true)
                alive = true
                channel.close(promise: nil)
            } catch {
                alive = false
            }
            let open = state.withLock { state -> [Pair] in
                state.probing.remove(index)
                guard !alive else { return [] }
                state.deaths[index, default: 0] += 1
                return Array((state.open.removeValue(forKey: index) ?? [:]).values)
            }
            guard !alive else { return }
            leave(index, because: "no answer to a probe within \(DurationSyntax.format(liveness.probeTimeout)) while a statement waited")
            logger.warning("closing the connections to a database host that stopped answering", metadata: ["host": "\(hosts[index])", "connections": "\(open.count)"])
            for pair in open { pair.end(because: "the database host \(hosts[index]) stopped answering; connect again") }
        }
    }

    /// A probe's connection: TCP and the SSLRequest's answer, no TLS handshake.
    private func connect(_ index: Int, on eventLoop: any EventLoop, timeout: Duration, plain: Bool) async throws -> any Channel {
        let host = hosts[index]
        let channel = try await Self.bootstrap(on: eventLoop, liveness: liveness, timeout: timeout).connect(host: host.name, port: host.port).get()
        do {
            _ = try await Self.sslRequest(channel, timeout: timeout)
            return channel
        } catch {
            channel.close(promise: nil)
            throw error
        }
    }
}
