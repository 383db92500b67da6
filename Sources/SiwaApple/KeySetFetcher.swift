import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import Synchronization

/// Fetches over HTTP(S) with a timeout and a size bound, or reads a `file://` URL.
package struct DefaultKeySetFetcher: KeySetFetcher {
    package struct FetchError: Error, CustomStringConvertible {
        package let description: String
        package init(description: String) { self.description = description }
    }

    /// A JWKS is a few KiB; anything past this is not one.
    static let maximumSize = 1 << 20
    let timeout: Duration

    package init(timeout: Duration = .seconds(10)) {
        self.timeout = timeout
    }

    package func fetch(_ url: URL) async throws -> Data {
        if url.isFileURL {
            do {
                let data = try Data(contentsOf: url)
                guard data.count <= Self.maximumSize else { throw FetchError(description: "\(url.path) is larger than 1 MiB") }
                return data
            } catch let error as FetchError {
                throw error
            } catch {
                throw FetchError(description: "cannot read \(url.path): \(error.localizedDescription)")
            }
        }
        // Redirects are followed here, not by the client: never from https down to http.
        var current = url
        var response: HTTPClientResponse
        var hop = 0
        while true {
            guard LoopbackHost.allowsCalls(to: current) else {
                throw FetchError(description: "refused GET \(URLRedaction.redacted(current)): plain http only to a loopback address")
            }
            var request = HTTPClientRequest(url: current.absoluteString)
            request.headers.add(name: "Accept", value: "application/json")
            do {
                response = try await AppleHTTP.client.execute(request, timeout: .seconds(timeout.components.seconds))
            } catch {
                throw FetchError(description: "GET \(URLRedaction.redacted(current)) failed: \(URLRedaction.scrubbed("\(error)"))")
            }
            guard [301, 302, 303, 307, 308].contains(response.status.code) else { break }
            hop += 1
            do {
                current = try KeySetRedirect.next(from: current, location: response.headers.first(name: "location"), hop: hop)
            } catch {
                throw FetchError(description: "GET \(URLRedaction.redacted(url)): \(error)")
            }
        }
        guard response.status == .ok else {
            throw FetchError(description: "GET \(URLRedaction.redacted(current)) answered \(response.status.code)")
        }
        do {
            let body = try await response.body.collect(upTo: Self.maximumSize)
            return Data(body.readableBytesView)
        } catch {
            throw FetchError(description: "GET \(URLRedaction.redacted(current)): body unreadable or over 1 MiB (\(error))")
        }
    }
}
