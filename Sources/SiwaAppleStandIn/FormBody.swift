import Foundation
import SiwaDomain

/// An `application/x-www-form-urlencoded` body, the only kind Apple's auth endpoints take.
/// Strict, so a client's mistake shows here rather than at Apple: invalid UTF-8 or percent-encoding,
/// or a parameter sent twice (RFC 6749 §3.1), makes it no form at all (`invalid_request`).
package struct FormBody: Sendable, Equatable {
    package let fields: [String: String]

    package init?(_ bytes: some Sequence<UInt8>) {
        guard let text = String(validating: Array(bytes), as: UTF8.self), let decoded = FormURLEncoding.decode(text) else { return nil }
        var fields: [String: String] = [:]
        for (name, value) in decoded {
            guard !name.isEmpty, fields.updateValue(value, forKey: name) == nil else { return nil }
        }
        self.fields = fields
    }

    /// A parameter's value; nil when absent or empty (Apple treats both as missing).
    package subscript(name: String) -> String? {
        fields[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Whether a `Content-Type` names a form body (parameters such as `charset` allowed).
    package static func isForm(contentType: String?) -> Bool {
        guard let mediaType = contentType?.split(separator: ";", maxSplits: 1).first else { return false }
        return mediaType.trimmingCharacters(in: .whitespaces).lowercased() == "application/x-www-form-urlencoded"
    }
}
