import Foundation
import Logging
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import Testing

/// An API failure that is not the caller's: 500 (the database refused the statement) or 503 (it
/// could not be reached), with a request_id that names the one log line holding the cause.
@Suite("API errors: request_id on 500 and 503 matches the log line")
struct APIErrorTests {
    /// The `request failed` log line with this request id.
    static func logLine(_ h: Harness, id: String) -> String? {
        h.logs.all.first { $0.contains("request failed") && $0.contains(id) }
    }

    @Test("500 internal: the answer says nothing internal; its request_id is in the logged line with the SQL error")
    func internalError() async throws {
        let h = try await Harness.start()
        let token = try await API.token(h, [.admin])
        // The statement fails inside PostgreSQL (what a broken migration or a bug would do).
        try await h.server.client.query("ALTER TABLE notifications RENAME TO notifications_elsewhere")
        let answer = try await API.call(h, .GET, "/v1/notifications", token: token)
        #expect(answer.status == 500 && answer.json?["error"] == .string("internal"), "\(answer.status) \(answer.body)")
        let id = try #require(answer.json?["request_id"]?.stringValue)
        #expect(answer.json?["message"]?.stringValue?.contains(id) == true)
        #expect(!answer.body.contains("notifications") && !answer.body.contains("42P01"), "nothing internal: \(answer.body)")
        let line = try #require(Self.logLine(h, id: id), "no log line with \(id)")
        #expect(line.contains("42P01") || line.contains("does not exist"), "\(line)")
        await h.stop()
    }

    @Test("503 unavailable: PostgreSQL stopped; Retry-After, and the request_id names the logged line")
    func unavailable() async throws {
        let directory = "/tmp/siwa-apierr-\(UUID().uuidString.prefix(8).lowercased())"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = EmbeddedPostgres(options: .init(dataDirectory: directory, durable: false), logger: Logger(label: "api-503"))
        let connection = try await cluster.start()
        let database = PostgresClient.Configuration(
            unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database)
        let migrator = PostgresClient(configuration: database)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await migrator.run() }
            try await Migrator(client: migrator, logger: Logger(label: "m")).migrate()
            group.cancelAll()
        }
        let h = try await Harness.start(database: database) { $0.database.timeout = .seconds(2) }
        let token = try await API.token(h, [.admin])
        try await cluster.stop()
        let answer = try await API.call(h, .GET, "/v1/notifications", token: token)
        #expect(answer.status == 503 && answer.json?["error"] == .string("unavailable"), "\(answer.status) \(answer.body)")
        #expect(answer.headers.first(name: "retry-after").flatMap(Int.init) != nil)
        let id = try #require(answer.json?["request_id"]?.stringValue, "\(answer.body)")
        #expect(Self.logLine(h, id: id) != nil, "no log line with \(id): \(h.logs.all.filter { $0.contains("request failed") })")
        await h.stop()
    }
}
