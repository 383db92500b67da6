import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import SiwaDomain
import Synchronization

/// A local stand-in for Apple's auth endpoints (`/auth/token`, `/auth/revoke`,
/// `/auth/usermigrationinfo`), speaking Apple's
/// wire format over real HTTP, so every path that talks to Apple runs offline: in tests, and for a
/// user through `siwa-events standin serve`. Codes are issued here (`/standin/codes`, `issueCode`),
/// as Apple issues them to a device at sign-in; `id_token`s are signed with the local key of
/// `keys generate`, which a server started with `SIWA_APPLE_JWKS_URL=file://…` trusts.
package final class AppleAuthStandIn: Service, Sendable {
    package struct Configuration: Sendable {
        package var teams: [StandInTeam]
        /// Signs `id_token`s: the key of `keys generate`.
        package var signer: AppleStyleSigner
        package var host = "127.0.0.1"
        /// 0: a port the kernel picks (`url` says which).
        package var port = 0
        package var limits = AuthLedger.Limits()
        /// The largest request body read.
        package var maximumBodySize = 16 * 1024
        /// How far in the future a client secret's `iat` may be, in seconds.
        package var clockSkew: Int64 = 5
        /// The clock codes expire and client secrets are checked by (tests move it).
        package var now: @Sendable () -> Date = { Date() }
        /// Keys the `transfer_sub`s (`TransferSubs`); nil: the signer's key, so the same `--keys`
        /// directory gives the same `transfer_sub`s across restarts.
        package var transferSeed: [UInt8]?
        /// Added before every answer: Apple's round trip, for benchmarks on loopback.
        package var latency: Duration = .zero

        package init(teams: [StandInTeam], signer: AppleStyleSigner) {
            self.teams = teams
            self.signer = signer
        }
    }

    let configuration: Configuration
    let secrets: ClientSecretCheck
    let ledger: Mutex<AuthLedger>
    /// The mail providers' suppression lists (`MailRoutes`).
    let mailLedger = Mutex(MailLedger())
    let transfers: TransferSubs
    let logger: Logger
    private let listening = ListeningPort()

    package init(_ configuration: Configuration, logger: Logger) {
        self.configuration = configuration
        self.secrets = ClientSecretCheck(teams: configuration.teams, clockSkew: configuration.clockSkew)
        self.ledger = Mutex(AuthLedger(limits: configuration.limits))
        self.transfers = TransferSubs(seed: configuration.transferSeed ?? Array(configuration.signer.privateKeyPEM.utf8))
        self.logger = logger
    }

    /// Serves until cancelled or, in a service group, until graceful shutdown.
    package func run() async throws {
        let router = Router()
        addAuthRoutes(to: router)
        addControlRoutes(to: router)
        addMailRoutes(to: router)
        let app = Application(
            router: router, configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: nil),
            onServerRunning: { [listening] channel in listening.resolve(.success(channel.localAddress?.port ?? 0)) },
            logger: logger)
        do {
            try await app.run()
            listening.resolve(.failure(CancellationError()))
        } catch {
            listening.resolve(.failure(error))
            throw error
        }
    }

    /// The base URL (`http://HOST:PORT`), once listening; throws when `run` failed or ended first.
    package var url: URL {
        get async throws {
            let host = configuration.host.contains(":") && !configuration.host.hasPrefix("[") ? "[\(configuration.host)]" : configuration.host
            return URL(string: "http://\(host):\(try await listening.port)")!
        }
    }

    // MARK: What tests use (the same as the /standin routes)

    /// A code for `authorization`, as Apple hands one to a device at sign-in.
    package func issueCode(_ authorization: AuthLedger.Authorization) -> String {
        ledger.withLock { $0.issueCode(authorization, now: configuration.now()) }
    }

    /// Marks a user for app transfers: a private-relay address, or the app revoked.
    package func markUser(_ user: AuthLedger.MigrationUser) {
        ledger.withLock { $0.markUser(user) }
    }

    /// Every revocation request kept, oldest first.
    package var revocations: [RevocationRecord] { ledger.withLock { $0.revocations } }

    /// Makes the next `count` requests to `endpoint` answer `status` (e.g. 503), with no body.
    package func failNext(_ count: Int, of endpoint: StandInEndpoint, status: Int) {
        ledger.withLock { $0.failNext(count, of: endpoint, status: status) }
    }
}

/// Apple's answers: JSON as Apple sends it, errors as a 400 with one word.
enum AppleAnswer {
    static func json(_ value: JSONValue, status: HTTPResponse.Status = .ok) -> Response {
        Response(
            status: status, headers: [.contentType: "application/json;charset=UTF-8"],
            body: .init(byteBuffer: ByteBuffer(string: value.jsonText)))
    }

    static func error(_ error: AppleAuthError) -> Response {
        json(["error": .string(error.word ?? AppleAuthError.invalidRequest.word ?? "")], status: .badRequest)
    }
}

/// The port the server bound, for whoever awaits it before or after it is known.
private final class ListeningPort: Sendable {
    private let state = Mutex<(result: Result<Int, any Error>?, waiters: [CheckedContinuation<Int, any Error>])>((nil, []))

    func resolve(_ result: Result<Int, any Error>) {
        let waiters = state.withLock { state -> [CheckedContinuation<Int, any Error>] in
            guard state.result == nil else { return [] }
            state.result = result
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(with: result) }
    }

    var port: Int {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let ready = state.withLock { state -> Result<Int, any Error>? in
                    if let result = state.result { return result }
                    state.waiters.append(continuation)
                    return nil
                }
                if let ready { continuation.resume(with: ready) }
            }
        }
    }
}
