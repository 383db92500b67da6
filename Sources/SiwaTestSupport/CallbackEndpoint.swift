import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// A backend's callback endpoint on loopback: records every request it gets (headers and exact
/// body), answers with the statuses the test queues (then 200), or never answers at all (a dead
/// endpoint that accepts connections and hangs).
package final class CallbackEndpoint: Sendable {
    package struct Received: Sendable {
        package var headers: [String: String]
        package var body: [UInt8]
        package var status: Int
        package var bodyText: String { String(decoding: body, as: UTF8.self) }
    }

    private struct State {
        var statuses: [Int] = []
        var hang = false
        var received: [Received] = []
        var open = 0
    }

    private final class Shared: Sendable {
        let state = Mutex(State())
        /// One element per request, as it arrives (before it is answered, or left hanging).
        let arrivals = AsyncStream.makeStream(of: Void.self)
        /// The same, as a count to wait on.
        let arrived = Progress()
    }

    private let shared: Shared
    private let task: Task<Void, any Error>
    package let url: URL

    private init(url: URL, shared: Shared, task: Task<Void, any Error>) {
        self.url = url
        self.shared = shared
        self.task = task
    }

    package static func start(hang: Bool = false) async throws -> CallbackEndpoint {
        let shared = Shared()
        shared.state.withLock { $0.hang = hang }
        let router = Router()
        router.post("/siwa/callbacks") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1 << 20)
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            // Recorded before it counts as arrived, so a test that waited for an arrival can read it.
            let answer = shared.state.withLock { state -> Int? in
                if state.hang {
                    state.open += 1
                    return nil
                }
                let status = state.statuses.isEmpty ? 200 : state.statuses.removeFirst()
                state.received.append(Received(headers: headers, body: Array(buffer: body), status: status))
                return status
            }
            shared.arrivals.continuation.yield()
            shared.arrived.add()
            guard let status = answer else {
                // Never answers; the sender's timeout (or the test's end) closes the connection.
                try? await Task.sleep(for: .seconds(3600))
                shared.state.withLock { $0.open -= 1 }
                return Response(status: .serviceUnavailable)
            }
            return Response(status: .init(code: status))
        }
        let (port, task) = try await startLoopbackServer(router, label: "callback-endpoint")
        return CallbackEndpoint(url: URL(string: "http://127.0.0.1:\(port)/siwa/callbacks")!, shared: shared, task: task)
    }

    /// Requests as they arrive: awaiting the next one waits for a delivery to reach the endpoint.
    package var arrivals: AsyncStream<Void> { shared.arrivals.stream }

    /// The next answers, in order (200 once they run out).
    package func answer(_ statuses: [Int]) { shared.state.withLock { $0.statuses.append(contentsOf: statuses) } }
    package var received: [Received] { shared.state.withLock { $0.received } }
    /// Every request that arrived, answered or held open.
    package var arrived: Progress { shared.arrived }
    /// Requests the dead endpoint is holding open right now.
    package var openRequests: Int { shared.state.withLock { $0.open } }

    package func stop() async {
        task.cancel()
        _ = await task.result
    }
}
