import Foundation
import SiwaDomain

/// The settings a command can read, one group per part of the service. A command lists the groups
/// it reads; its `--help` shows those and no others.
package enum SettingGroup: String, CaseIterable, Sendable {
    case database, apple, appleCredentials, listeners, process, history, jobs, accounts, callbacks, alerts, suppressions, logging

    package var title: String {
        switch self {
        case .database: "Database"
        case .apple: "Apple notifications and identity tokens"
        case .appleCredentials: "Apple credentials (calls to Apple's auth endpoints)"
        case .listeners: "Listeners"
        case .history: "History and rejections"
        case .process: "Process"
        case .jobs: "Jobs and workers"
        case .accounts: "Accounts and sessions"
        case .callbacks: "Callbacks"
        case .alerts: "Alerts"
        case .suppressions: "Suppressions (mail providers)"
        case .logging: "Logging"
        }
    }
}

/// What every setting has, whatever its type: what `--help`, the docs' table and the command line
/// need to know about it.
package struct SettingInfo: Sendable, Equatable {
    /// The environment variable, e.g. `SIWA_PORT`.
    package let variable: String
    /// The flag, without its dashes, e.g. `port`.
    package let flag: String
    package let group: SettingGroup
    /// The default as the docs show it (Markdown), e.g. "`8080`" or "none".
    package let shownDefault: String
    /// One line for `--help`.
    package let help: String
    /// The docs' "Meaning" column (Markdown).
    package let docs: String
    /// A secret: never shown in a debug description of the configuration source, also read from
    /// `fileVariable`, and its flag's help says other local users can see a flag.
    package let secret: Bool

    /// How error messages name it: `SIWA_PORT (--port)`.
    package var name: String { "\(variable) (--\(flag))" }

    /// A secret's `_FILE` variable (`SIWA_CALLBACK_SECRET_FILE`), the container platforms'
    /// convention: it names a file holding the value, which keeps the secret out of the command line
    /// (`/proc/PID/cmdline`, readable by every local user) and out of the environment. nil otherwise.
    package var fileVariable: String? { secret ? variable + "_FILE" : nil }
}

/// One setting, defined once: variable, flag, group, default, parser, help and the docs' text.
/// The flags, the environment reading, `--help` and the table in docs/reference.md all come from these.
package struct Setting<Value: Sendable>: Sendable {
    package let info: SettingInfo
    package let defaultValue: Value
    /// Turns the trimmed, non-empty text into a value, or says what is expected.
    package let parse: @Sendable (String) throws(SettingValueError) -> Value

    package init(
        _ variable: String, flag: String, _ group: SettingGroup, default defaultValue: Value, shown: String,
        help: String, docs: String, secret: Bool = false, parse: @escaping @Sendable (String) throws(SettingValueError) -> Value
    ) {
        self.info = SettingInfo(variable: variable, flag: flag, group: group, shownDefault: shown, help: help, docs: docs, secret: secret)
        self.defaultValue = defaultValue
        self.parse = parse
    }
}

/// What a parser says about text it cannot use (the caller adds the setting's name).
package struct SettingValueError: Error {
    package let message: String
    package init(_ message: String) { self.message = message }
}

extension Setting where Value == Duration {
    /// A duration (`500ms`, `30s`, `5m`, `2h`, `400d`), at least `minimum` when one is given.
    static func duration(
        _ variable: String, flag: String, _ group: SettingGroup, default value: Duration, minimum: Duration? = nil, help: String, docs: String
    ) -> Self {
        Self(variable, flag: flag, group, default: value, shown: "`\(DurationSyntax.format(value))`", help: help, docs: docs) { text throws(SettingValueError) in
            let parsed: Duration
            do { parsed = try DurationSyntax.parse(text) } catch { throw SettingValueError(String(describing: error)) }
            if let minimum, parsed < minimum {
                throw SettingValueError("must be at least \(DurationSyntax.format(minimum)) (got \(DurationSyntax.format(parsed)))")
            }
            return parsed
        }
    }
}

extension Setting where Value == Int {
    static func integer(
        _ variable: String, flag: String, _ group: SettingGroup, default value: Int, _ range: ClosedRange<Int>, help: String, docs: String
    ) -> Self {
        Self(variable, flag: flag, group, default: value, shown: "`\(value)`", help: help, docs: docs) { text throws(SettingValueError) in
            guard let number = Int(text), range.contains(number) else {
                throw SettingValueError("must be an integer between \(range.lowerBound) and \(range.upperBound) (got \"\(text)\")")
            }
            return number
        }
    }
}

extension Setting where Value == Bool {
    /// `shownAs`: the spelling the docs use for the default (`on` or `true`).
    static func boolean(
        _ variable: String, flag: String, _ group: SettingGroup, default value: Bool, shownAs: (on: String, off: String), help: String, docs: String
    ) -> Self {
        Self(variable, flag: flag, group, default: value, shown: "`\(value ? shownAs.on : shownAs.off)`", help: help, docs: docs) { text throws(SettingValueError) in
            switch text.lowercased() {
            case "1", "true", "on", "yes": return true
            case "0", "false", "off", "no": return false
            default: throw SettingValueError("must be on or off (true/false) (got \"\(text.lowercased())\")")
            }
        }
    }
}

extension Setting where Value == String {
    static func text(_ variable: String, flag: String, _ group: SettingGroup, default value: String, help: String, docs: String) -> Self {
        Self(variable, flag: flag, group, default: value, shown: "`\(value)`", help: help, docs: docs) { text throws(SettingValueError) in text }
    }
}

extension Setting where Value == String? {
    /// Text with no default; `shown` says what its absence means.
    static func optionalText(
        _ variable: String, flag: String, _ group: SettingGroup, shown: String, help: String, docs: String, secret: Bool = false
    ) -> Self {
        Self(variable, flag: flag, group, default: nil, shown: shown, help: help, docs: docs, secret: secret) { text throws(SettingValueError) in text }
    }
}

extension Setting {
    /// One of an enumeration's raw values (case-insensitive); `expected` lists them in words.
    static func choice(
        _ variable: String, flag: String, _ group: SettingGroup, default value: Value, expected: String, help: String, docs: String
    ) -> Self where Value: RawRepresentable<String> {
        Self(variable, flag: flag, group, default: value, shown: "`\(value.rawValue)`", help: help, docs: docs) { text throws(SettingValueError) in
            guard let parsed = Value(rawValue: text.lowercased()) else { throw SettingValueError("must be \(expected) (got \"\(text)\")") }
            return parsed
        }
    }
}

extension Setting where Value == URL? {
    /// An `https://` or `http://` URL with a host; no default, `shown` says what its absence means.
    static func webURL(
        _ variable: String, flag: String, _ group: SettingGroup, shown: String, help: String, docs: String, secret: Bool = false
    ) -> Self {
        Self(variable, flag: flag, group, default: nil, shown: shown, help: help, docs: docs, secret: secret) { text throws(SettingValueError) in
            try parseWebURL(text, secret: secret)
        }
    }
}

/// `text` as an `https://` or `http://` URL with a host (a callback's, an alert webhook's). The
/// error quotes the value only without a credential: never a secret setting's, never a userinfo.
func parseWebURL(_ text: String, secret: Bool = false) throws(SettingValueError) -> URL {
    guard let url = URL(string: text), ["https", "http"].contains(url.scheme?.lowercased() ?? ""), url.host?.isEmpty == false else {
        let shown = URLRedaction.scrubbed(text)
        let got = secret ? "the value is a secret, not shown" : shown.replacingOccurrences(of: "***@", with: "").contains("@") ? "the value holds an @, not shown" : "got \"\(shown)\""
        throw SettingValueError("must be an https:// or http:// URL (\(got))")
    }
    return url
}
