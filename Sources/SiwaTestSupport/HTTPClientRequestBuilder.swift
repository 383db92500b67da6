import AsyncHTTPClient
import NIOCore
import NIOHTTP1

/// A tiny POST helper over AsyncHTTPClient for tests that run their own server.
package struct HTTPClientRequestBuilder {
    package var url: String
    package var body: String

    package init(url: String, body: String) {
        self.url = url
        self.body = body
    }

    package static func post(_ url: String, body: String) -> HTTPClientRequestBuilder { .init(url: url, body: body) }

    package mutating func send() async throws -> Int {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.body = .bytes(ByteBuffer(string: body))
        return Int(try await HTTPClient.shared.execute(request, timeout: .seconds(30)).status.code)
    }

    /// GETs `url` (with a bearer token if given); returns the status.
    package static func get(_ url: String, bearer: String? = nil) async throws -> Int {
        var request = HTTPClientRequest(url: url)
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        _ = try await response.body.collect(upTo: 1 << 22)
        return Int(response.status.code)
    }
}
