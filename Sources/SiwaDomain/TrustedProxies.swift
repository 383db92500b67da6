import Foundation

/// `SIWA_TRUSTED_PROXIES`: the peers whose `X-Forwarded-For` is believed. Anyone else could write
/// any address into that header, so for them the socket peer is the remote address.
package struct TrustedProxies: Sendable, Equatable {
    package struct InvalidCIDR: Error, CustomStringConvertible {
        package let input: String
        package var description: String {
            "SIWA_TRUSTED_PROXIES: \"\(input)\" is not a CIDR block or address (e.g. 10.0.0.0/8, 127.0.0.1, ::1/128)"
        }
    }

    struct Block: Sendable, Equatable {
        var network: [UInt8]
        var prefix: Int
        func contains(_ address: [UInt8]) -> Bool {
            guard address.count == network.count else { return false }
            var remaining = prefix
            for (a, n) in zip(address, network) where remaining > 0 {
                let bits = min(8, remaining)
                let mask: UInt8 = bits == 8 ? 0xFF : ~(0xFF >> UInt8(bits))
                if a & mask != n & mask { return false }
                remaining -= bits
            }
            return true
        }
    }

    let blocks: [Block]
    package static let none = TrustedProxies(blocks: [])

    init(blocks: [Block]) { self.blocks = blocks }

    /// Parses a comma-separated CIDR list (a bare address means the single host).
    package init(parsing list: String) throws(InvalidCIDR) {
        var blocks: [Block] = []
        for item in list.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
            let parts = item.split(separator: "/", maxSplits: 1).map(String.init)
            guard let address = Self.bytes(parts[0]) else { throw InvalidCIDR(input: item) }
            let prefix: Int
            if parts.count == 2 {
                guard let value = Int(parts[1]), value >= 0, value <= address.count * 8 else { throw InvalidCIDR(input: item) }
                prefix = value
            } else {
                prefix = address.count * 8
            }
            blocks.append(Block(network: address, prefix: prefix))
        }
        self.blocks = blocks
    }

    package func contains(_ address: String) -> Bool {
        guard let bytes = Self.bytes(address) else { return false }
        return blocks.contains { $0.contains(bytes) }
    }

    /// The client address: the right-most `X-Forwarded-For` entry not itself a trusted proxy,
    /// when the peer is trusted; otherwise the peer.
    package func clientAddress(peer: String?, forwardedFor: String?) -> String? {
        guard let peer, contains(peer), let forwardedFor else { return peer }
        let hops = forwardedFor.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        for hop in hops.reversed() where !contains(hop) {
            return Self.bytes(hop) != nil ? hop : peer
        }
        return hops.first ?? peer
    }

    /// IPv4 or IPv6 text → bytes (IPv4-mapped IPv6 becomes IPv4).
    static func bytes(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            return withUnsafeBytes(of: &v4) { Array($0) }
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 {
            let bytes = withUnsafeBytes(of: &v6) { Array($0) }
            if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF {
                return Array(bytes[12...])
            }
            return bytes
        }
        return nil
    }
}
