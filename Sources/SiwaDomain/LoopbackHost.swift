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
    /// Whether we may call `url`: https anywhere, plain http only to a loopback host (tests, the
    /// local stand-in), where no network attacker can read or answer the call.
    package static func allowsCalls(to url: URL) -> Bool {
        switch url.scheme?.lowercased() {
        case "https": true
        case "http": url.host.map(contains) ?? false
        default: false
        }
    }
}
