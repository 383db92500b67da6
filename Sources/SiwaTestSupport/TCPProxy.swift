import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// A database "host" for failover tests: a TCP listener on 127.0.0.1 forwarding each connection
/// to a unix socket (a test cluster's). A test can silence it, as a host gone off the network
/// behind something that keeps its sockets open (nothing forwarded either way, nothing closed, new
/// connections accepted and never answered), or have it cut a connection right after a COMMIT
/// went through to the server, before its answer comes back.
package final class TCPProxy: Sendable {
    private struct State {
        var silent = false
        var cutAfterCommit = false
        var cuts = 0
        var server: (any Channel)?
        var open: [any Channel] = []
    }

    package let target: String
    private let state = Mutex(State())

    package init(target: String) {
        self.target = target
    }

    /// Listens on a free port of 127.0.0.1; returns it.
    package func start() async throws -> Int {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { [self] inbound in
                accepted(inbound)
                return inbound.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        state.withLock { $0.server = server }
        return server.localAddress?.port ?? 0
    }

    /// Nothing more is forwarded, nothing closed; new connections hang.
    package func silence() { state.withLock { $0.silent = true } }

    /// The next client bytes holding `COMMIT` are forwarded, then both sides are closed.
    package func cutAfterNextCommit() { state.withLock { $0.cutAfterCommit = true } }

    /// Connections cut after a COMMIT so far.
    package var cuts: Int { state.withLock { $0.cuts } }

    package func stop() async {
        let (server, open) = state.withLock { ($0.server, $0.open) }
        try? await server?.close()
        for channel in open { channel.close(promise: nil) }
    }

    var isSilent: Bool { state.withLock { $0.silent } }

    /// Whether `bytes` from a client should be cut after; disarms.
    func takeCut(_ bytes: ByteBuffer) -> Bool {
        state.withLock { state in
            guard state.cutAfterCommit, bytes.readableBytesView.firstRange(of: Array("COMMIT".utf8)) != nil else { return false }
            state.cutAfterCommit = false
            state.cuts += 1
            return true
        }
    }

    private func accepted(_ inbound: any Channel) {
        state.withLock { $0.open.append(inbound) }
        guard !isSilent else { return }
        ClientBootstrap(group: inbound.eventLoop).connect(unixDomainSocketPath: target).whenComplete { [self] result in
            switch result {
            case .failure:
                inbound.close(promise: nil)
            case .success(let upstream):
                state.withLock { $0.open.append(upstream) }
                let client = ProxyHalf(proxy: self, fromClient: true)
                let server = ProxyHalf(proxy: self, fromClient: false)
                client.partner = server
                server.partner = client
                do {
                    try upstream.pipeline.syncOperations.addHandler(server)
                    try inbound.pipeline.syncOperations.addHandler(client)
                    inbound.setOption(.autoRead, value: true).whenFailure { _ in inbound.close(promise: nil) }
                } catch {
                    inbound.close(promise: nil)
                    upstream.close(promise: nil)
                }
            }
        }
    }
}

private final class ProxyHalf: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let proxy: TCPProxy
    let fromClient: Bool
    var partner: ProxyHalf?
    var context: ChannelHandlerContext?

    init(proxy: TCPProxy, fromClient: Bool) {
        self.proxy = proxy
        self.fromClient = fromClient
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !proxy.isSilent, let other = partner?.context else { return }
        let bytes = unwrapInboundIn(data)
        if fromClient, proxy.takeCut(bytes) {
            other.writeAndFlush(data).whenComplete { _ in
                other.close(promise: nil)
                context.close(promise: nil)
            }
            return
        }
        other.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) { partner?.context?.flush() }

    func channelInactive(context: ChannelHandlerContext) {
        if !proxy.isSilent { partner?.context?.close(promise: nil) }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !proxy.isSilent { context.close(promise: nil) }
    }
}
