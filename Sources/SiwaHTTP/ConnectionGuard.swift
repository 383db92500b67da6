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
    /// A connection with no request in progress (between requests). Longer than the upstream
    /// keep-alive of nginx (60s) and Caddy (2m), so a proxy never reuses a connection that is
    /// being closed.
    package var idleTimeout: Duration = .seconds(150)
    /// From accepting a connection (completing its TLS handshake, when serving TLS) until its first
    /// request's first byte: a client that connects and says nothing holds a place this long, not
    /// `idleTimeout`. Proxies and Apple send their request at once.
    package var firstRequestTimeout: Duration = .seconds(10)
    /// From accepting a TLS connection until its handshake completes (when serving TLS).
    package var tlsHandshakeTimeout: Duration = .seconds(10)
    /// Open connections at most, per listener. One more takes the place of the longest-idle
    /// connection (see `ConnectionRegistry`); it is closed at once only if every one has a request
    /// in progress.
    package var maximumConnections = 1024

    package init() {}
}

/// Why the guard closed a connection (the `siwa_connections_closed_total` label).
package enum ConnectionCut: String, Sendable, CaseIterable {
    case overCapacity = "over_capacity"
    /// At the maximum, the longest-idle connection was closed to make room for a new one.
    case idleEvicted = "idle_evicted"
    case requestTimeout = "request_timeout"
    case idleTimeout = "idle_timeout"
    case firstRequestTimeout = "first_request_timeout"
    case tlsHandshakeTimeout = "tls_handshake_timeout"
}

/// One listener's open connections against its maximum, and which of them are idle (no request in
/// progress: before the first or between requests) since when. At the maximum a new connection
/// takes the place of the longest-idle one, so silent sockets cannot keep a genuine client out;
/// only connections that all have a request in progress refuse it. Child channels live on
/// different event loops: the table is behind a lock, and each reports its own changes.
package final class ConnectionRegistry: Sendable {
    /// What `admit` decided for a new connection.
    package enum Admission {
        case admitted
        /// Admitted in place of this idle connection, which is no longer counted: close it.
        case admittedInPlaceOf(any Channel)
        case refused
    }

    private struct Entry {
        let channel: any Channel
        /// When it became idle (an order, not a time); nil while a request is in progress.
        var idleSince: UInt64?
    }

    private struct State {
        var entries: [ObjectIdentifier: Entry] = [:]
        var ticks: UInt64 = 0
        var waiters: [(condition: @Sendable (Int) -> Bool, continuation: CheckedContinuation<Void, Never>)] = []

        mutating func tick() -> UInt64 {
            ticks += 1
            return ticks
        }

        /// The waiters whose condition the count now meets, removed.
        mutating func satisfiedWaiters() -> [CheckedContinuation<Void, Never>] {
            guard !waiters.isEmpty else { return [] }
            let count = entries.count
            let met = waiters.filter { $0.condition(count) }
            waiters.removeAll { $0.condition(count) }
            return met.map(\.continuation)
        }
    }

    private let state = Mutex(State())
    let maximum: Int

    package init(maximum: Int) { self.maximum = maximum }

    package var current: Int { state.withLock { $0.entries.count } }

    /// Counts `channel` (idle: it has sent nothing yet), in place of the longest-idle connection
    /// when `maximum` are open, unless all of them have a request in progress.
    package func admit(_ channel: any Channel) -> Admission {
        let (admission, waiters) = state.withLock { state -> (Admission, [CheckedContinuation<Void, Never>]) in
            var admission = Admission.admitted
            if state.entries.count >= maximum {
                let longestIdle = state.entries.lazy.compactMap { key, entry in entry.idleSince.map { (key, $0) } }.min { $0.1 < $1.1 }
                guard let (key, _) = longestIdle, let evicted = state.entries.removeValue(forKey: key) else { return (.refused, []) }
                admission = .admittedInPlaceOf(evicted.channel)
            }
            state.entries[ObjectIdentifier(channel)] = Entry(channel: channel, idleSince: state.tick())
            return (admission, state.satisfiedWaiters())
        }
        for waiter in waiters { waiter.resume() }
        return admission
    }

    /// `channel` has a request in progress (`idle` false) or none (true); ignored once it is no
    /// longer counted (closed, or taken the place of).
    package func update(_ channel: any Channel, idle: Bool) {
        state.withLock { state in
            let key = ObjectIdentifier(channel)
            guard state.entries[key] != nil else { return }
            let since = idle ? state.tick() : nil
            state.entries[key]?.idleSince = since
        }
    }

    /// `channel` closed: its place is free (if it still held one).
    package func closed(_ channel: any Channel) {
        let waiters = state.withLock { state in
            state.entries.removeValue(forKey: ObjectIdentifier(channel)) == nil ? [] : state.satisfiedWaiters()
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once the open-connection count meets `condition` (for tests: a connection is counted
    /// on its event loop, after the client's `connect` has returned).
    package func wait(until condition: @escaping @Sendable (Int) -> Bool) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let met = state.withLock { state in
                if condition(state.entries.count) { return true }
                state.waiters.append((condition, continuation))
                return false
            }
            if met { continuation.resume() }
        }
    }
}

/// A listener's child channel with the limits applied: counted in `ConnectionRegistry` (over the
/// maximum, a new connection is closed before anything is read, or the longest-idle one is);
/// `ConnectionDeadlines` sits first in its pipeline and `RequestPhaseReporter` (after the HTTP
/// codec, see `additionalHandlers`) tells it where a request begins and ends.
package struct GuardedChildChannel<Inner: ServerChildChannel>: ServerChildChannel {
    package typealias Value = Inner.Value

    let inner: Inner
    let limits: ConnectionLimits
    let tls: Bool
    let connections: ConnectionRegistry
    let onCut: @Sendable (ConnectionCut) -> Void

    package init(_ inner: Inner, limits: ConnectionLimits, tls: Bool, connections: ConnectionRegistry, onCut: @escaping @Sendable (ConnectionCut) -> Void) {
        self.inner = inner
        self.limits = limits
        self.tls = tls
        self.connections = connections
        self.onCut = onCut
    }

    /// The handlers to add after the HTTP codec (`HTTP1Channel.Configuration.additionalChannelHandlers`).
    package static func additionalHandlers() -> [any RemovableChannelHandler] { [RequestPhaseReporter()] }

    package func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        switch connections.admit(channel) {
        case .refused:
            onCut(.overCapacity)
            channel.close(promise: nil)
            return channel.eventLoop.makeFailedFuture(ConnectionRefused(maximum: connections.maximum))
        case .admittedInPlaceOf(let idle):
            onCut(.idleEvicted)
            idle.eventLoop.execute { idle.close(promise: nil) }  // its own loop: it may be another one
        case .admitted:
            break
        }
        let connections = self.connections
        channel.closeFuture.whenComplete { _ in connections.closed(channel) }
        let (limits, tls, onCut) = (self.limits, self.tls, self.onCut)
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(
                ConnectionDeadlines(limits: limits, tls: tls, connections: connections, onCut: onCut), position: .first)
        }.flatMap {
            inner.setup(channel: channel, logger: logger)
        }
    }

    package func handle(value: Value, logger: Logger) async {
        await inner.handle(value: value, logger: logger)
    }
}

/// A connection refused because `maximum` were open, each with a request in progress.
package struct ConnectionRefused: Error, CustomStringConvertible {
    package let maximum: Int
    package var description: String { "\(maximum) connections are open, each with a request in progress (SIWA_HTTP_MAX_CONNECTIONS)" }
}

/// Where a connection is, as `RequestPhaseReporter` sees it after the HTTP codec (and TLS).
package enum ConnectionPhaseEvent: Sendable {
    case handshakeCompleted
    case requestRead
    case responseWritten
}

/// First in the pipeline (raw bytes, before TLS): keeps the current phase's deadline and closes
/// the connection when it passes; tells `ConnectionRegistry` whether a request is in progress.
/// One NIO timer per connection, re-armed lazily: a phase whose deadline is no earlier than the
/// armed timer's leaves it, and the timer, firing early, arms itself for the deadline then due.
/// Keep-alive traffic so schedules no timer per request (BENCHMARKS.md).
package final class ConnectionDeadlines: ChannelDuplexHandler, RemovableChannelHandler {
    package typealias InboundIn = Any
    package typealias OutboundIn = Any

    private enum Phase {
        case handshake
        /// Accepted (and handshaken), nothing of a request read yet.
        case firstRequest
        case idle
        /// `responded`: the answer went out before the request's last byte was read (e.g. 413).
        case request(responded: Bool)
        /// The request is read; its answer is being made (bounded by the route, not here).
        /// `nextRequestStarted`: bytes of another request arrived meanwhile (pipelining).
        case responding(nextRequestStarted: Bool)

        /// No request in progress: the connection may make room for a new one at the maximum.
        var isIdle: Bool {
            switch self {
            case .handshake, .firstRequest, .idle: true
            case .request, .responding: false
            }
        }
    }

    private let limits: ConnectionLimits
    private let tls: Bool
    private let connections: ConnectionRegistry?
    private let onCut: @Sendable (ConnectionCut) -> Void
    private var phase: Phase?
    /// The current phase's deadline and the cut it makes; nil while its answer is being made.
    private var due: (at: NIODeadline, cut: ConnectionCut)?
    /// The armed timer and when it fires: never later than `due`.
    private var timer: (task: Scheduled<Void>, at: NIODeadline)?
    /// Half-closures seen: once both halves are shut the connection is closed whole, so it is not
    /// held (and counted) until its idle deadline.
    private var inputClosed = false
    private var outputClosed = false

    /// `connections`: where the connection is counted (admitted idle), none in unit tests.
    package init(limits: ConnectionLimits, tls: Bool, connections: ConnectionRegistry? = nil, onCut: @escaping @Sendable (ConnectionCut) -> Void) {
        self.limits = limits
        self.tls = tls
        self.connections = connections
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
        case .idle?, .firstRequest?: enter(.request(responded: false), context)
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
        case (.handshakeCompleted, .handshake?): enter(.firstRequest, context)
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
        enter(tls ? .handshake : .firstRequest, context)
    }

    private func enter(_ next: Phase, _ context: ChannelHandlerContext) {
        // Admitted idle: only a change is reported (an idle connection's age is its first report's).
        if next.isIdle != (phase?.isIdle ?? true) { connections?.update(context.channel, idle: next.isIdle) }
        phase = next
        let limit: (Duration, ConnectionCut)? =
            switch next {
            case .handshake: (limits.tlsHandshakeTimeout, .tlsHandshakeTimeout)
            case .firstRequest: (limits.firstRequestTimeout, .firstRequestTimeout)
            case .idle: (limits.idleTimeout, .idleTimeout)
            case .request: (limits.requestTimeout, .requestTimeout)
            case .responding: nil
            }
        due = limit.map { (duration, cut) in (context.eventLoop.now + TimeAmount(duration), cut) }
        if let due, timer.map({ due.at < $0.at }) ?? true { arm(at: due.at, context) }
    }

    /// The timer fired: cuts the connection if its current deadline has passed, else arms the
    /// timer again for that deadline (none while an answer is being made).
    private func fired(_ context: ChannelHandlerContext) {
        timer = nil
        guard let due else { return }
        guard due.at <= context.eventLoop.now else { return arm(at: due.at, context) }
        self.due = nil
        onCut(due.cut)
        context.close(promise: nil)
    }

    private func arm(at deadline: NIODeadline, _ context: ChannelHandlerContext) {
        timer?.task.cancel()
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = (context.eventLoop.scheduleTask(deadline: deadline) { loopBound.value.0.fired(loopBound.value.1) }, deadline)
    }

    private func cancel() {
        timer?.task.cancel()
        timer = nil
        due = nil
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
