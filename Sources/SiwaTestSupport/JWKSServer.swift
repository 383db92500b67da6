import Foundation
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// A stand-in for `https://appleid.apple.com/auth/keys` on loopback: serves whatever key set the
/// test sets, counts fetches, and can be made to fail — for rotation, rate limit and outage tests.
package final class JWKSServer: Sendable {
    private struct State {
        var document: Data
        var failing = false
        var fetches = 0
    }

    private final class Shared: Sendable {
        let state: Mutex<State>
        init(document: Data) { state = Mutex(State(document: document)) }
    }

    private let shared: Shared
    private let task: Task<Void, any Error>
    package let url: URL

    private init(url: URL, shared: Shared, task: Task<Void, any Error>) {
        self.url = url
        self.shared = shared
        self.task = task
    }

    /// `redirects`: paths answered with a 302 to the given Location (redirect tests).
    package static func start(document: Data, redirects: [String: String] = [:]) async throws -> JWKSServer {
        let shared = Shared(document: document)
        let router = Router()
        for (path, location) in redirects {
            router.get(RouterPath(path)) { _, _ -> Response in Response(status: .found, headers: [.location: location]) }
        }
        router.get("/auth/keys") { _, _ -> Response in
            let (document, failing) = shared.state.withLock { state in
                state.fetches += 1
                return (state.document, state.failing)
            }
            if failing { return Response(status: .serviceUnavailable) }
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: document)))
        }
        let (port, task) = try await startLoopbackServer(router, label: "jwks-server")
        return JWKSServer(url: URL(string: "http://127.0.0.1:\(port)/auth/keys")!, shared: shared, task: task)
    }

    package var fetches: Int { shared.state.withLock { $0.fetches } }
    /// `path` on this server.
    package func url(_ path: String) -> URL { URL(string: path, relativeTo: url)!.absoluteURL }
    package func serve(_ document: Data) { shared.state.withLock { $0.document = document } }
    package func setFailing(_ failing: Bool) { shared.state.withLock { $0.failing = failing } }

    package func stop() async {
        task.cancel()
        _ = await task.result
    }
}

/// Runs `router` on a free loopback port until the returned task is cancelled: the stand-ins for
/// servers a test talks to (Apple's key set, a backend's callback endpoint).
package func startLoopbackServer(_ router: Router<BasicRequestContext>, label: String) async throws -> (port: Int, task: Task<Void, any Error>) {
    let started = OnceContinuation<Int>()
    let app = Application(
        router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
        onServerRunning: { started.resume(.success($0.localAddress?.port ?? 0)) },
        logger: Logger(label: label, factory: { _ in SwiftLogNoOpLogHandler() }))
    let task = Task { try await app.run() }
    return (try await started.value, task)
}
