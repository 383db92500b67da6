import NIOCore
import NIOPosix

/// The load generator's sending side: keep-alive HTTP/1.1 connections on one event loop, bodies
/// encoded before the clock starts, only the status line and `Content-Length` of answers read, so
/// the generator takes little of the CPU it shares with the server (BENCHMARKS.md). Open loop:
/// request `i` is due `i / rate` s after the start and goes out on the first free connection; its
/// latency runs from sending to the whole answer. Not a general client (no chunked, no TLS).
final class OpenLoopLoad: @unchecked Sendable {  // all state is confined to `loop`
    private let loop: any EventLoop
    private let host: String
    private let port: Int
    private let requests: [ByteBuffer]
    private let rate: Double?
    private let results: Results
    private let started = ContinuousClock.now
    private var next = 0
    private var open = 0
    private let finished: EventLoopPromise<Void>

    /// A request's bytes: `POST path` with a JSON body.
    static func post(path: String, host: String, json body: Substring) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.writeString("POST \(path) HTTP/1.1\r\nHost: \(host)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n")
        buffer.writeSubstring(body)
        return buffer
    }

    /// Sends `requests` over `connections` connections and returns when every one is answered
    /// (or failed: status 0).
    static func run(host: String, port: Int, connections: Int, requests: [ByteBuffer], rate: Double?, results: Results) async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let load = OpenLoopLoad(loop: loop, host: host, port: port, requests: requests, rate: rate, results: results)
        loop.execute { for _ in 0..<connections { load.openConnection() } }
        try await load.finished.futureResult.get()
    }

    private init(loop: any EventLoop, host: String, port: Int, requests: [ByteBuffer], rate: Double?, results: Results) {
        self.loop = loop
        self.host = host
        self.port = port
        self.requests = requests
        self.rate = rate
        self.results = results
        self.finished = loop.makePromise()
    }

    private func openConnection() {
        open += 1
        let handler = Lane(load: self)
        ClientBootstrap(group: loop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(handler) } }
            .connect(host: host, port: port)
            .whenComplete { result in
                switch result {
                case .success(let channel): self.dispatch(handler, on: channel)
                case .failure: self.failOne()
                }
            }
    }

    /// The next request on `lane`, at its due time; or, when none is left, the lane closes.
    fileprivate func dispatch(_ lane: Lane, on channel: any Channel) {
        guard next < requests.count else {
            lane.closed = true
            channel.close(promise: nil)
            closeLane()
            return
        }
        let index = next
        next += 1
        lane.holding = true
        let send: @Sendable () -> Void = {
            guard !lane.closed else { return }  // lost while it waited: counted as failed already
            lane.sent = ContinuousClock.now
            lane.inFlight = true
            channel.writeAndFlush(self.requests[index], promise: nil)
        }
        if let rate {
            let due = started + .nanoseconds(Int64(Double(index) / rate * 1e9))
            let wait = due - ContinuousClock.now
            if wait > .zero {
                loop.scheduleTask(in: .nanoseconds(wait.components.seconds * 1_000_000_000 + wait.components.attoseconds / 1_000_000_000)) { send() }
                return
            }
        }
        send()
    }

    fileprivate func answered(_ lane: Lane, status: UInt, on channel: any Channel) {
        lane.holding = false
        results.add(latency: ContinuousClock.now - lane.sent, status: status)
        dispatch(lane, on: channel)
    }

    /// A connection was lost: the request it held (sent, or waiting for its due time) counts as
    /// status 0, and a new connection takes its place while requests are left.
    fileprivate func lost(_ lane: Lane) {
        if lane.holding { results.add(latency: lane.inFlight ? ContinuousClock.now - lane.sent : .zero, status: 0) }
        if next < requests.count { openConnection() }  // before the close: `open` must not reach 0 meanwhile
        closeLane()
    }

    /// A connection could not be opened: one request is counted as failed (so a server that is
    /// down ends the run instead of looping), and another connection is tried while requests are left.
    private func failOne() {
        if next < requests.count {
            next += 1
            results.add(latency: .zero, status: 0)
        }
        if next < requests.count { openConnection() }
        closeLane()
    }

    private func closeLane() {
        open -= 1
        if open == 0 { finished.succeed(()) }
    }

    /// One connection: parses answers off its bytes.
    fileprivate final class Lane: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private let load: OpenLoopLoad
        var sent = ContinuousClock.now
        /// It has taken a request (from `dispatch` until its answer).
        var holding = false
        /// That request has been sent.
        var inFlight = false
        /// Closed, by `dispatch` (no request left) or on its loss.
        var closed = false
        private var received = ByteBuffer()
        private static let headEnd: [UInt8] = Array("\r\n\r\n".utf8)

        init(load: OpenLoopLoad) { self.load = load }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var incoming = unwrapInboundIn(data)
            received.writeBuffer(&incoming)
            while inFlight, let status = takeResponse() {
                inFlight = false
                load.answered(self, status: status, on: context.channel)
            }
        }

        /// One whole answer off the front of `received`, if it is all there.
        private func takeResponse() -> UInt? {
            let view = received.readableBytesView
            guard let end = view.firstRange(of: Self.headEnd) else { return nil }
            let head = String(decoding: view[view.startIndex..<end.lowerBound], as: UTF8.self)
            let lines = head.split(separator: "\r\n")
            let code = lines.first?.split(separator: " ").dropFirst().first.flatMap { UInt($0) } ?? 0
            var length = 0
            for line in lines.dropFirst() where line.lowercased().hasPrefix("content-length:") {
                length = Int(String(line.dropFirst("content-length:".count).filter { $0 != " " && $0 != "\t" })) ?? 0
            }
            let total = end.upperBound - view.startIndex + length
            guard received.readableBytes >= total else { return nil }
            received.moveReaderIndex(forwardBy: total)
            received.discardReadBytes()
            return code
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !closed {
                closed = true
                load.lost(self)
            }
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
