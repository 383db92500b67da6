/// Text taken from a token nobody has verified (or from a refused body): bounded before it is
/// stored or logged, so one request cannot make a row too large to index or a log line of any size.
package enum UntrustedText {
    /// Longest value kept, in UTF-8 bytes (Apple's kid, jti, sub and bundle IDs are far shorter).
    package static let maximumBytes = 256

    /// `text` itself when it fits in `limit` bytes; otherwise its longest prefix of whole characters
    /// that fits with a visible marker naming how many bytes were cut (`…[+29744 bytes]`).
    package static func bounded(_ text: String, limit: Int = maximumBytes) -> String {
        let utf8 = text.utf8
        guard utf8.count > limit else { return text }
        let marker = "…[+\(utf8.count) bytes]"
        let room = max(0, limit - marker.utf8.count)
        var end = text.startIndex
        var used = 0
        for character in text {
            let size = character.utf8.count
            guard used + size <= room else { break }
            used += size
            end = text.index(after: end)
        }
        return String(text[..<end]) + "…[+\(utf8.count - used) bytes]"
    }

    package static func bounded(_ text: String?, limit: Int = maximumBytes) -> String? {
        text.map { bounded($0, limit: limit) }
    }
}
