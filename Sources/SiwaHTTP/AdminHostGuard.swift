import Hummingbird
import SiwaDomain

/// The admin listener answers only requests addressed to it: a `Host` that is an IP address, or
/// one of the names it is configured for (`SIWA_ADMIN_HOSTS`, default `localhost`). A page in an
/// operator's browser that points its own domain at 127.0.0.1 (DNS rebinding) sends its domain as
/// `Host`, and is refused before any route (`/metrics`, the API, the dashboard) runs.
package struct AdminHostGuard: RouterMiddleware {
    package typealias Context = SiwaRequestContext
    let names: Set<String>

    package init(names: [String]) {
        self.names = Set(names.map { $0.lowercased() })
    }

    package func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        // HTTP/1.0 without Host cannot be a browser's request.
        guard let authority = request.head.authority else { return try await next(request, context) }
        guard Self.allows(authority: authority, names: names) else {
            throw APIError(
                .misdirectedRequest, code: "misdirected_request",
                message: "this admin listener does not answer to Host \(UntrustedText.bounded(authority, limit: 128)); add the name to SIWA_ADMIN_HOSTS if it is yours")
        }
        return try await next(request, context)
    }

    /// `authority` is `host[:port]` or `[v6][:port]`: an IP literal, or a configured name.
    package static func allows(authority: String, names: Set<String>) -> Bool {
        var host = authority.lowercased()
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            let rest = host[host.index(after: close)...]
            guard rest.isEmpty || (rest.hasPrefix(":") && rest.dropFirst().allSatisfy(\.isNumber)) else { return false }
            return isIPv6(String(host[host.index(after: host.startIndex)..<close]))
        }
        if let colon = host.lastIndex(of: ":") {
            guard host[host.index(after: colon)...].allSatisfy(\.isNumber) else { return false }
            host = String(host[..<colon])
        }
        if host.hasSuffix(".") { host.removeLast() }
        return isIPv4(host) || names.contains(host)
    }

    static func isIPv4(_ text: String) -> Bool {
        let octets = text.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets.allSatisfy { !$0.isEmpty && $0.count <= 3 && $0.allSatisfy(\.isNumber) && Int($0)! <= 255 }
    }

    static func isIPv6(_ text: String) -> Bool {
        !text.isEmpty && text.contains(":") && text.allSatisfy { $0.isHexDigit || $0 == ":" || $0 == "." }
    }
}
