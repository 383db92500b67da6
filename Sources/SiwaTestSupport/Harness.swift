import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaHTTP
import SiwaStore

/// A receiver on its own fresh database with a local Apple-style signing key.
package struct Harness {
    package static let aud = "com.example.app"

    /// A file of the real Apple-signed fixtures in `Tests/fixtures/apple-real/` (its README says
    /// where each came from). Missing, the error says where they were looked for.
    package static func appleFixture(_ name: String) throws -> URL {
        let file = Repository.appleFixtures.appendingPathComponent(name)
        guard FileManager.default.fileExists(atPath: file.path) else { throw MissingFixture(path: file.path) }
        return file
    }

    package struct MissingFixture: Error, CustomStringConvertible {
        package let path: String
        package var description: String { "no Apple fixture at \(path): Tests/fixtures/apple-real/ is part of the repository" }
    }
    package let server: TestServer
    package let signer: AppleStyleSigner
    package let logs: LogCapture
    package let config: Configuration

    package static func start(
        signer: AppleStyleSigner? = nil, jwksURL: URL? = nil, database databaseConfiguration: PostgresClient.Configuration? = nil,
        keyFetcher: any KeySetFetcher = DefaultKeySetFetcher(), fixedTime: Date? = nil, _ configure: (inout Configuration) -> Void = { _ in }
    ) async throws -> Harness {
        let signer = try signer ?? AppleStyleSigner.generate()
        var config = try Configuration(bundleIDs: [aud])
        config.http.port = 0
        config.role = .receiver  // the effect tests run workers themselves
        // A bound against a hang, not a speed check: with a dozen tests, their servers and
        // clusters on two cores, a token check or a commit batch sometimes took over the 5 s
        // default and answered 503 (the group-commit test, schemathesis). The 503 on a database
        // deadline itself is tested with its own short timeout (DatabaseTests).
        config.database.timeout = .seconds(30)
        if let jwksURL {
            config.apple.keys.sourceURL = jwksURL
        } else {
            let file = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("jwks-\(UUID().uuidString).json")
            try signer.jwksDocument().write(to: file)
            config.apple.keys.sourceURL = file
        }
        configure(&config)
        let logs = LogCapture()
        let database: PostgresClient.Configuration
        if let given = databaseConfiguration {
            database = given
        } else {
            database = try await TestCluster.shared.makeDatabase()
        }
        let server = try await TestServer.start(config: config, database: database, logger: logs.logger(), keyFetcher: keyFetcher, clock: { fixedTime ?? Date() })
        return Harness(server: server, signer: signer, logs: logs, config: config)
    }

    package func stop() async { await server.stop() }

    /// Runs `statements` in order on `database` through a client of its own (closed afterwards).
    package static func execute(on database: PostgresClient.Configuration, _ statements: [String]) async throws {
        let client = PostgresClient(configuration: database)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            for statement in statements { try await client.query(PostgresQuery(unsafeSQL: statement)) }
            group.cancelAll()
        }
    }

    package func notification(type: String = "consent-revoked", sub: String = "001234.abcdef.0001", eventTime: Date = Date(), email: String? = nil, jti: String = UUID().uuidString) throws -> String {
        try signer.notification(aud: Self.aud, type: type, sub: sub, eventTime: eventTime, email: email, isPrivateEmail: email == nil ? nil : true, jti: jti)
    }

    /// A token signed by our key with arbitrary header and claims edits.
    package func forged(header: [String: JSONValue]? = nil, _ edit: (inout [String: JSONValue]) -> Void = { _ in }) throws -> String {
        var claims = AppleStyleSigner.claims(aud: Self.aud, type: "consent-revoked", sub: "001.forged.1", eventTime: Date(), issuedAt: Date()).objectValue!
        edit(&claims)
        return try signer.sign(header: .object(header ?? ["kid": .string(signer.kid), "alg": .string("RS256")]), claims: .object(claims))
    }

    package func count(_ sql: String) async throws -> Int {
        for try await (count,) in try await server.client.query(PostgresQuery(unsafeSQL: sql)).decode((Int,).self) {
            return count
        }
        return 0
    }

    /// Posts `jws`, retrying a 503 as Apple does: for tests that set a short database timeout,
    /// which a commit on a loaded machine (a dozen tests on two cores) sometimes outlasts.
    package func deliver(_ jws: String) async throws -> TestServer.Answer {
        var answer = try await server.post(jws: jws)
        for _ in 0..<10 where answer.status == 503 { answer = try await server.post(jws: jws) }
        return answer
    }

    /// Runs `body` while another session holds a lock that the receiver's inserts wait for (as a
    /// long migration would); released (rolled back) afterwards.
    package func withInsertsBlocked<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let logger = Logger(label: "lock")
        return try await server.client.withConnection { connection in
            try await connection.query("BEGIN", logger: logger)
            try await connection.query("LOCK TABLE notifications IN SHARE MODE", logger: logger)
            let result = try await body()
            try await connection.query("ROLLBACK", logger: logger)
            return result
        }
    }

    /// Writes buffered rejection records now (the recorder flushes every second on its own).
    package func flushRejections() async { await server.application.rejections.flush() }
}

extension Configuration {
    /// Every setting's default, with these bundle IDs.
    package init(bundleIDs: [String]) throws {
        try self.init(SettingSource(environment: ["SIWA_APPLE_BUNDLE_IDS": bundleIDs.joined(separator: ",")]))
    }
}
