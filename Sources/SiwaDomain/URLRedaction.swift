import Foundation

/// URLs as logs, messages and health answers show them: the userinfo (`user:password@`) is
/// replaced by `***@`, so a credential in a configured URL (a key-set mirror, a webhook) never
/// reaches a log line or an unauthenticated caller.
package enum URLRedaction {
    /// `url` without its userinfo.
    package static func redacted(_ url: URL) -> String { scrubbed(url.absoluteString) }

    /// `text` with the userinfo of every `scheme://user:password@` in it replaced (error
    /// messages quote URLs).
    package static func scrubbed(_ text: String) -> String {
        text.replacingOccurrences(of: #"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#@\s]*@"#, with: "$1***@", options: .regularExpression)
    }
}
