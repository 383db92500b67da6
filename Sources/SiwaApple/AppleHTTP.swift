import AsyncHTTPClient
import Logging

/// The one HTTP client every call to Apple goes through (key set, `/auth/*`): it follows no
/// redirect (a 3xx is an answer, or `KeySetRedirect`'s to judge) and lives as long as the process.
enum AppleHTTP {
    static let client = HTTPClient(
        eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: .init(redirectConfiguration: .disallow),
        backgroundActivityLogger: Logger(label: "siwa.apple.http", factory: { _ in SwiftLogNoOpLogHandler() }))
}
