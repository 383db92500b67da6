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
@Suite("API errors: request_id on 500 and 503 matches the log line", .timeLimit(.minutes(10)))
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
        let own = try await OwnCluster.start(label: "api-503")
        defer { own.remove() }
        let h = try await Harness.start(database: own.database) { $0.database.timeout = .seconds(2) }
        let token = try await API.token(h, [.admin])
        try await own.cluster.stop()
        let answer = try await API.call(h, .GET, "/v1/notifications", token: token)
        #expect(answer.status == 503 && answer.json?["error"] == .string("unavailable"), "\(answer.status) \(answer.body)")
        #expect(answer.headers.first(name: "retry-after").flatMap(Int.init) != nil)
        let id = try #require(answer.json?["request_id"]?.stringValue, "\(answer.body)")
        #expect(Self.logLine(h, id: id) != nil, "no log line with \(id): \(h.logs.all.filter { $0.contains("request failed") })")
        await h.stop()
    }
}
