import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
import NIOTLS
import Synchronization

/// What one connection may hold, whoever is on the other end: an idle timeout alone restarts on
/// every byte, so a request has a deadline of its own from its first byte (head and body).
package struct ConnectionLimits: Sendable, Equatable {
    /// From a request's first byte until its last byte is read.
    package var requestTimeout: Duration = .seconds(30)
    /// A connection with no request in progress (before the first, between requests). Longer than
    /// the upstream keep-alive of nginx (60s) and Caddy (2m), so a proxy never reuses a connection
    /// that is being closed.
    package var idleTimeout: Duration = .seconds(150)
    /// From accepting a TLS connection until its handshake completes (when serving TLS).
    package var tlsHandshakeTimeout: Duration = .seconds(10)
    /// Open connections at most, per listener; one more is closed at once.
    package var maximumConnections = 1024

    package init() {}
}

/// Why the guard closed a connection (the `siwa_connections_closed_total` label).
package enum ConnectionCut: String, Sendable, CaseIterable {
    case overCapacity = "over_capacity"
    case requestTimeout = "request_timeout"
    case idleTimeout = "idle_timeout"
    case tlsHandshakeTimeout = "tls_handshake_timeout"
}

/// Counts one listener's open connections against its maximum.
package final class ConnectionCounter: Sendable {
    private let open = Atomic<Int>(0)
    let maximum: Int

    package init(maximum: Int) { self.maximum = maximum }

    package var current: Int { open.load(ordering: .relaxed) }

    /// Takes a place, unless `maximum` are open.
    func tryOpen() -> Bool {
        var current = open.load(ordering: .relaxed)
        while current < maximum {
            let (exchanged, original) = open.compareExchange(expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    func closed() { open.subtract(1, ordering: .relaxed) }
}

/// A listener's child channel with the limits applied: over the maximum, a new connection is closed
/// before anything is read; otherwise `ConnectionDeadlines` sits first in its pipeline and
/// `RequestPhaseReporter` (after the HTTP codec, see `additionalHandlers`) tells it where a request
/// begins and ends.
package struct GuardedChildChannel<Inner: ServerChildChannel>: ServerChildChannel {
    package typealias Value = Inner.Value

    let inner: Inner
    let limits: ConnectionLimits
    let tls: Bool
    let connections: ConnectionCounter
    let onCut: @Sendable (ConnectionCut) -> Void

    package init(_ inner: Inner, limits: ConnectionLimits, tls: Bool, connections: ConnectionCounter, onCut: @escaping @Sendable (ConnectionCut) -> Void) {
        self.inner = inner
        self.limits = limits
        self.tls = tls
        self.connections = connections
        self.onCut = onCut
    }

    /// The handlers to add after the HTTP codec (`HTTP1Channel.Configuration.additionalChannelHandlers`).
    package static func additionalHandlers() -> [any RemovableChannelHandler] { [RequestPhaseReporter()] }

    package func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        guard connections.tryOpen() else {
            onCut(.overCapacity)
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ConnectionRefused(maximum: connections.maximum))
        }
        let connections = self.connections
        channel.closeFuture.whenComplete { _ in connections.closed() }
        let (limits, tls, onCut) = (self.limits, self.tls, self.onCut)
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(ConnectionDeadlines(limits: limits, tls: tls, onCut: onCut), position: .first)
        }.flatMap {
            inner.setup(channel: channel, logger: logger)
        }
    }

    package func handle(value: Value, logger: Logger) async {
        await inner.handle(value: value, logger: logger)
    }
}

/// A connection refused because `maximum` were open.
package struct ConnectionRefused: Error, CustomStringConvertible {
    package let maximum: Int
    package var description: String { "\(maximum) connections are open (SIWA_HTTP_MAX_CONNECTIONS)" }
}

/// Where a connection is, as `RequestPhaseReporter` sees it after the HTTP codec (and TLS).
package enum ConnectionPhaseEvent: Sendable {
    case handshakeCompleted
    case requestRead
    case responseWritten
}

/// First in the pipeline (raw bytes, before TLS): keeps one deadline at a time, on the event loop
/// (a NIO scheduled task), and closes the connection when it passes.
package final class ConnectionDeadlines: ChannelDuplexHandler, RemovableChannelHandler {
    package typealias InboundIn = Any
    package typealias OutboundIn = Any

    private enum Phase {
        case handshake
        case idle
        /// `responded`: the answer went out before the request's last byte was read (e.g. 413).
        case request(responded: Bool)
        /// The request is read; its answer is being made (bounded by the route, not here).
        /// `nextRequestStarted`: bytes of another request arrived meanwhile (pipelining).
        case responding(nextRequestStarted: Bool)
    }

    private let limits: ConnectionLimits
    private let tls: Bool
    private let onCut: @Sendable (ConnectionCut) -> Void
    private var phase: Phase?
    private var deadline: Scheduled<Void>?
    /// Half-closures seen: once both halves are shut the connection is closed whole, so it is not
    /// held (and counted) until its idle deadline.
    private var inputClosed = false
    private var outputClosed = false

    package init(limits: ConnectionLimits, tls: Bool, onCut: @escaping @Sendable (ConnectionCut) -> Void) {
        self.limits = limits
        self.tls = tls
        self.onCut = onCut
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context) }
    }

    package func channelActive(context: ChannelHandlerContext) {
        start(context)
        context.fireChannelActive()
    }

    package func handlerRemoved(context: ChannelHandlerContext) { cancel() }

    package func channelInactive(context: ChannelHandlerContext) {
        cancel()
        context.fireChannelInactive()
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch phase {
        case .idle?: enter(.request(responded: false), context)
        case .responding?: phase = .responding(nextRequestStarted: true)
        case .handshake?, .request?, nil: break
        }
        context.fireChannelRead(data)
    }

    package func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .inputClosed? = event as? ChannelEvent {
            inputClosed = true
            if outputClosed { context.close(promise: nil) }
        }
        context.fireUserInboundEventTriggered(event)
    }

    package func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .output {
            outputClosed = true
            if inputClosed {
                context.close(mode: .all, promise: promise)
                return
            }
        }
        context.close(mode: mode, promise: promise)
    }

    package func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let event = event as? ConnectionPhaseEvent else {
            return context.triggerUserOutboundEvent(event, promise: promise)
        }
        switch (event, phase) {
        case (.handshakeCompleted, .handshake?): enter(.idle, context)
        case (.requestRead, .request(responded: true)?): enter(.idle, context)
        case (.requestRead, _): enter(.responding(nextRequestStarted: false), context)
        case (.responseWritten, .request?): phase = .request(responded: true)  // its deadline stays
        case (.responseWritten, .responding(let next)?): enter(next ? .request(responded: false) : .idle, context)
        default: break
        }
        promise?.succeed()
    }

    private func start(_ context: ChannelHandlerContext) {
        guard phase == nil else { return }
        enter(tls ? .handshake : .idle, context)
    }

    private func enter(_ next: Phase, _ context: ChannelHandlerContext) {
        cancel()
        phase = next
        let limit: (Duration, ConnectionCut)? =
            switch next {
            case .handshake: (limits.tlsHandshakeTimeout, .tlsHandshakeTimeout)
            case .idle: (limits.idleTimeout, .idleTimeout)
            case .request: (limits.requestTimeout, .requestTimeout)
            case .responding: nil
            }
        guard let (duration, cut) = limit else { return }
        let onCut = self.onCut
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: .nanoseconds(Int64(duration.components.seconds) * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000)) {
            onCut(cut)
            loopBound.value.close(promise: nil)
        }
    }

    private func cancel() {
        deadline?.cancel()
        deadline = nil
    }
}

/// After the HTTP codec: tells `ConnectionDeadlines` (through an outbound user event, which travels
/// toward the head of the pipeline) when the TLS handshake completed, a request's last part was
/// read, and a response's last part was written.
final class RequestPhaseReporter: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .end = unwrapInboundIn(data) {
            context.triggerUserOutboundEvent(ConnectionPhaseEvent.requestRead, promise: nil)
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let isEnd = if case .end = unwrapOutboundIn(data) { true } else { false }
        context.write(data, promise: promise)
        if isEnd { context.triggerUserOutboundEvent(ConnectionPhaseEvent.responseWritten, promise: nil) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted? = event as? TLSUserEvent {
            context.triggerUserOutboundEvent(ConnectionPhaseEvent.handshakeCompleted, promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }
}
