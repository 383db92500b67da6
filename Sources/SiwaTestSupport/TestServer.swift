import AsyncHTTPClient
import Foundation
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import ServiceLifecycle
import SiwaApp
import SiwaApple
import SiwaDomain
import Synchronization

/// The real receiver on free loopback ports (public and admin listeners), over a real database,
/// for tests and benchmarks.
package final class TestServer: Sendable {
    /// The public listener: `POST /apple/notifications`, `/health/*`.
    package let baseURL: String
    package let port: Int
    /// The admin listener: `/v1`, the dashboard, `/openapi.yaml`, `/metrics`.
    package let adminBaseURL: String
    package let application: SiwaApplication
    package let client: PostgresClient
    private let task: Task<Void, any Error>
    private let group: ServiceGroup

    private init(port: Int, adminPort: Int, application: SiwaApplication, client: PostgresClient, task: Task<Void, any Error>, group: ServiceGroup) {
        self.baseURL = "http://127.0.0.1:\(port)"
        self.port = port
        self.adminBaseURL = "http://127.0.0.1:\(adminPort)"
        self.application = application
        self.client = client
        self.task = task
        self.group = group
    }

    package static func start(
        config: Configuration, database: PostgresClient.Configuration, logger: Logger = Logger(label: "test-server"),
        keyFetcher: any KeySetFetcher = DefaultKeySetFetcher(), clock: @escaping @Sendable () -> Date = { Date() }
    ) async throws -> TestServer {
        var config = config
        config.http.host = "127.0.0.1"
        config.http.adminHost = "127.0.0.1"
        config.http.adminPort = 0
        let client = PostgresClient(configuration: database, backgroundLogger: logger)
        let application = SiwaApplication(config: config, client: client, logger: logger, keyFetcher: keyFetcher, clock: clock)
        let started = (public: OnceContinuation<Int>(), admin: OnceContinuation<Int>())
        let services = try application.services(
            config: config, client: client, logger: logger,
            onPublicRunning: { started.public.resume(.success($0.localAddress?.port ?? 0)) },
            onAdminRunning: { started.admin.resume(.success($0.localAddress?.port ?? 0)) })
        // Run as production does — a service group stopped by graceful shutdown, so services stop
        // in reverse order (the database client last) — not by cancellation.
        let group = ServiceGroup(configuration: .init(services: services, logger: logger))
        let task = Task {
            do {
                try await group.run()
                started.public.resume(.failure(CancellationError()))
                started.admin.resume(.failure(CancellationError()))
            } catch {
                started.public.resume(.failure(error))
                started.admin.resume(.failure(error))
                throw error
            }
        }
        let port = try await started.public.value
        let adminPort = try await started.admin.value
        // Serving starts while Apple's keys load; tests start from a loaded (or failed) key set.
        if config.receives { await application.keys.waitUntilStarted() }
        return TestServer(port: port, adminPort: adminPort, application: application, client: client, task: task, group: group)
    }

    /// Stops the server gracefully and waits for every service to finish.
    package func stop() async {
        await group.triggerGracefulShutdown()
        _ = await task.result
    }

    package struct Answer: Sendable {
        package var status: Int
        package var headers: HTTPHeaders
        package var body: String
        package var json: JSONValue? { JSONValue.parse(Data(body.utf8)) }
    }

    /// The listener that serves `path`: the public one for the notification route and health, the
    /// admin one for everything else.
    package func url(_ path: String) -> String {
        path.hasPrefix("/apple/") || path.hasPrefix("/health/") ? baseURL + path : adminBaseURL + path
    }

    package func request(_ method: HTTPMethod = .POST, _ path: String = "/apple/notifications", body: String? = nil, headers: [(String, String)] = [("Content-Type", "application/json")]) async throws -> Answer {
        var request = HTTPClientRequest(url: url(path))
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(string: body)) }
        // A bound against a hang, not a speed check: in the full suite (a dozen tests, their
        // servers and clusters on two cores) 500 concurrent requests through the shared client's
        // 8 connections took 60 s, and one request waited past an earlier 30 s bound (CI).
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(120))
        let bytes = try await response.body.collect(upTo: 1 << 22)
        return Answer(status: Int(response.status.code), headers: response.headers, body: String(buffer: bytes))
    }

    /// POSTs a compact JWS as Apple does.
    package func post(jws: String) async throws -> Answer {
        try await request(body: AppleStyleSigner.body(jws))
    }
}

/// A continuation resumed at most once, from whichever side gets there first.
package final class OnceContinuation<Value: Sendable>: Sendable {
    private let state = Mutex<(result: Result<Value, any Error>?, waiter: CheckedContinuation<Value, any Error>?)>((nil, nil))

    package init() {}

    package func resume(_ result: Result<Value, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<Value, any Error>? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result)
    }

    package var value: Value {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let ready = state.withLock { state -> Result<Value, any Error>? in
                    if let result = state.result { return result }
                    state.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(with: ready) }
            }
        }
    }
}
