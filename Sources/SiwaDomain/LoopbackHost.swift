import Foundation

/// Whether a host name or address is this machine's loopback: `localhost`, `::1`, or 127.0.0.0/8
/// written as four decimal octets (`127.evil.example` is a name, not an address).
package enum LoopbackHost {
    package static func contains(_ host: String) -> Bool {
        let host = host.lowercased().trimmingCharacters(in: ["[", "]"])
        if host == "localhost" || host == "::1" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false).map { UInt8($0) }
        return octets.count == 4 && octets.allSatisfy { $0 != nil } && octets[0] == 127
    }
}

extension LoopbackHost {
    /// Whether a request's `Host` (`host[:port]`, `[v6][:port]`) names this machine's loopback:
    /// `localhost`, 127.0.0.0/8 or `[::1]`, with any port or none. A page whose own domain resolves
    /// to 127.0.0.1 (DNS rebinding) sends that domain, and is not.
    package static func contains(authority: String) -> Bool {
        func isPort(_ text: Substring) -> Bool { text.allSatisfy { $0.isASCII && $0.isNumber } }
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return false }
            let rest = authority[authority.index(after: close)...]
            guard rest.isEmpty || (rest.hasPrefix(":") && isPort(rest.dropFirst())) else { return false }
            return authority[authority.index(after: authority.startIndex)..<close] == "::1"
        }
        var host = Substring(authority)
        if let colon = host.lastIndex(of: ":") {
            guard isPort(host[host.index(after: colon)...]) else { return false }
            host = host[..<colon]
        }
        return !host.isEmpty && !host.contains(where: { $0 == ":" || $0 == "[" }) && contains(String(host))
    }

    /// Whether we may call `url`: https anywhere, plain http only to a loopback host (tests, the
    /// local stand-in), where no network attacker can read or answer the call.
    package static func allowsCalls(to url: URL) -> Bool {
        switch url.scheme?.lowercased() {
        case "https": true
        case "http": url.host.map { contains($0) } ?? false
        default: false
        }
    }
}
