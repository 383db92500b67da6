import Logging
import NIOCore
import SiwaDomain

// The channel handlers of `DatabaseRelay`: a relayed pair's two halves, its wait for an answer,
// its start-up check, and how a pair ends.

/// A relayed connection: the pool's side and the server's.
struct Pair: Sendable {
    let client: any Channel
    let server: any Channel

    /// Ends the connection as PostgreSQL does when it terminates a session: a FATAL error to the
    /// client (SQLSTATE 08006), then close. postgres-nio fails a statement in flight on that error;
    /// a bare close of the socket can leave one waiting forever (see `BoundedPostgres`).
    func end(because message: String) {
        let error = Self.fatal(message, allocator: client.allocator)
        let (client, server) = (self.client, self.server)
        client.writeAndFlush(error).whenComplete { _ in
            client.close(promise: nil)
            server.close(promise: nil)
        }
    }
}

extension Pair {
    /// PostgreSQL's ErrorResponse for a session ended: FATAL, SQLSTATE 08006 (connection_failure).
    static func fatal(_ message: String, allocator: ByteBufferAllocator) -> ByteBuffer {
        var error = allocator.buffer(capacity: 64 + message.utf8.count)
        error.writeInteger(UInt8(ascii: "E"))
        let lengthIndex = error.writerIndex
        error.writeInteger(Int32(0))
        for (field, value) in [("S", "FATAL"), ("V", "FATAL"), ("C", "08006"), ("M", message)] {
            error.writeInteger(UInt8(ascii: Unicode.Scalar(field)!))
            error.writeNullTerminatedString(value)
        }
        error.writeInteger(UInt8(0))
        error.setInteger(Int32(error.writerIndex - lengthIndex), at: lengthIndex)
        return error
    }
}

enum RelayError: Error, CustomStringConvertible {
    case tlsRefused
    case noAnswer(Duration)

    var description: String {
        switch self {
        case .tlsRefused: "the server does not offer TLS, and sslmode=require"
        case .noAnswer(let timeout): "no answer within \(DurationSyntax.format(timeout))"
        }
    }
}

/// Takes the first byte a channel reads (the SSLRequest's answer).
final class FirstByte: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    let promise: EventLoopPromise<UInt8>

    init(promise: EventLoopPromise<UInt8>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        if let byte = buffer.readInteger(as: UInt8.self) { promise.succeed(byte) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(ChannelError.eof)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { promise.fail(error) }
}

/// Whether a statement waits for its answer, and for how long (on the pair's event loop).
final class Exchange {
    let eventLoop: any EventLoop
    let stallAfter: TimeAmount
    let onStall: @Sendable () -> Void
    /// Since when the client's last bytes wait for the server's (nil: none wait).
    var waitingSince: NIODeadline?
    var timer: Scheduled<Void>?
    var closed = false

    init(eventLoop: any EventLoop, stallAfter: TimeAmount, onStall: @escaping @Sendable () -> Void) {
        self.eventLoop = eventLoop
        self.stallAfter = stallAfter
        self.onStall = onStall
    }

    func clientSent() {
        guard waitingSince == nil else { return }
        let now = NIODeadline.now()
        waitingSince = now
        arm(at: now + stallAfter)
    }

    func serverSent() { waitingSince = nil }

    /// One timer at most, re-armed only when it fires: a busy connection costs one per `stallAfter`.
    func arm(at deadline: NIODeadline) {
        guard timer == nil, !closed else { return }
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        timer = eventLoop.scheduleTask(deadline: deadline) { bound.value.fire() }
    }

    func fire() {
        timer = nil
        guard let since = waitingSince, !closed else { return }
        let now = NIODeadline.now()
        if now - since >= stallAfter {
            onStall()
            arm(at: now + stallAfter)
        } else {
            arm(at: since + stallAfter)
        }
    }

    func close() {
        closed = true
        timer?.cancel()
        timer = nil
    }
}

/// One side of a relayed connection: what it reads, its partner writes.
final class RelayHalf: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    enum Side { case client, server }

    let side: Side
    let exchange: Exchange
    var partner: RelayHalf?
    var context: ChannelHandlerContext?

    init(side: Side, exchange: Exchange) {
        self.side = side
        self.exchange = exchange
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch side {
        case .client: exchange.clientSent()
        case .server: exchange.serverSent()
        }
        partner?.context?.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) { partner?.context?.flush() }

    /// Backpressure: a partner that cannot take more stops this side reading.
    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if let other = partner?.context { try? other.channel.syncOptions?.setOption(.autoRead, value: context.channel.isWritable) }
        context.fireChannelWritabilityChanged()
    }

    /// The server's side gone: the client is told as PostgreSQL tells a session it ends (a FATAL
    /// error, then close), which postgres-nio fails a statement in flight on; a bare close can
    /// leave one waiting out its limit (see `Pair.end`).
    func channelInactive(context: ChannelHandlerContext) {
        exchange.close()
        if let other = partner?.context {
            if side == .server, other.channel.isActive {
                other.writeAndFlush(wrapOutboundOut(Pair.fatal("the database server closed the connection", allocator: other.channel.allocator)))
                    .whenComplete { _ in other.close(promise: nil) }
            } else {
                other.close(promise: nil)
            }
        }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
}

/// Watches a relayed connection's start-up: holds what the server says after authentication until
/// it is ready, and closes the connection if the server reported itself read-only where
/// `target_session_attrs` wants writes. A server that refuses or closes before it is ready
/// (stopped, starting, recovering) is reported too: the next connection tries the next host.
final class StartupCheck: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    let attributes: DatabaseURL.SessionAttributes
    let onRefused: @Sendable (String) -> Void
    var pending: ByteBuffer?
    var held: [ByteBuffer] = []
    var authenticated = false
    var hotStandby = false
    var readOnlyDefault = false
    var done = false

    init(attributes: DatabaseURL.SessionAttributes, onRefused: @escaping @Sendable (String) -> Void) {
        self.attributes = attributes
        self.onRefused = onRefused
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done { onRefused("the server closed the connection before it was ready") }
        done = true
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return context.fireChannelRead(data) }
        var incoming = unwrapInboundIn(data)
        if pending == nil { pending = incoming } else { pending!.writeBuffer(&incoming) }
        var forwarded = false
        while let message = nextMessage() {
            let type = message.getInteger(at: message.readerIndex, as: UInt8.self) ?? 0
            switch type {
            case UInt8(ascii: "R") where !authenticated:
                authenticated = message.getInteger(at: message.readerIndex + 5, as: Int32.self) == 0
                if authenticated { held.append(message) } else { forward(message, context); forwarded = true }
            case UInt8(ascii: "S") where authenticated:
                parameter(message)
                held.append(message)
            case UInt8(ascii: "Z") where authenticated:
                held.append(message)
                return ready(context)
            case UInt8(ascii: "E"):
                // An error at start-up (a server starting, a refusal): the client reads it as is.
                held.append(message)
                onRefused("the server refused the connection at start-up")
                return pass(context)
            default:
                if authenticated { held.append(message) } else { forward(message, context); forwarded = true }
            }
        }
        if forwarded { context.fireChannelReadComplete() }
    }

    private func forward(_ message: ByteBuffer, _ context: ChannelHandlerContext) { context.fireChannelRead(wrapInboundOut(message)) }

    /// One whole message off `pending` (type byte, length including itself, body).
    private func nextMessage() -> ByteBuffer? {
        guard var buffer = pending, buffer.readableBytes >= 5, let length = buffer.getInteger(at: buffer.readerIndex + 1, as: Int32.self),
            length >= 4, buffer.readableBytes >= Int(length) + 1
        else { return nil }
        let message = buffer.readSlice(length: Int(length) + 1)
        pending = buffer
        return message
    }

    private func parameter(_ message: ByteBuffer) {
        var body = message.getSlice(at: message.readerIndex + 5, length: message.readableBytes - 5) ?? ByteBuffer()
        guard let name = body.readNullTerminatedString(), let value = body.readNullTerminatedString() else { return }
        if name == "in_hot_standby" { hotStandby = value == "on" }
        if name == "default_transaction_read_only" { readOnlyDefault = value == "on" }
    }

    private func ready(_ context: ChannelHandlerContext) {
        let readOnly = attributes != .any && (hotStandby || (attributes == .readWrite && readOnlyDefault))
        guard !readOnly else {
            done = true
            onRefused("a read-only server (target_session_attrs=\(attributes.rawValue))")
            context.close(promise: nil)
            return
        }
        pass(context)
    }

    /// Everything held and read so far goes on; from now on the bytes pass untouched.
    private func pass(_ context: ChannelHandlerContext) {
        done = true
        for message in held { forward(message, context) }
        held = []
        if let rest = pending, rest.readableBytes > 0 { forward(rest, context) }
        pending = nil
        context.fireChannelReadComplete()
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }
}
