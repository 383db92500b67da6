import Foundation
import NIOHTTP1
import SiwaDomain
import SiwaStore

/// Calls to the `/v1` API as a backend makes them, with tokens made in the store.
package enum API {
    package static func token(_ h: Harness, _ scopes: [APIScope], name: String = "t-\(UUID().uuidString.prefix(8))", expiresAt: Date? = nil) async throws -> String {
        try await TokenStore(client: h.server.client, logger: h.logs.logger()).create(name: name, scopes: scopes, expiresAt: expiresAt, actor: "test").token
    }

    package static func call(_ h: Harness, _ method: HTTPMethod, _ path: String, token: String?, body: JSONValue? = nil) async throws -> TestServer.Answer {
        var headers: [(String, String)] = [("Content-Type", "application/json")]
        if let token { headers.append(("Authorization", "Bearer \(token)")) }
        return try await h.server.request(method, path, body: body?.jsonText, headers: headers)
    }
}
