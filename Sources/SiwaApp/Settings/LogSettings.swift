import Logging
import SiwaDomain
import SiwaRuntime

extension Settings {
    package static let logLevel = Setting<Logger.Level?>(
        "SIWA_LOG_LEVEL", flag: "log-level", .logging, default: nil, shown: "`info` (`serve`), `warning` (other commands)",
        help: "trace|debug|info|notice|warning|error|critical",
        docs: "`trace`, `debug`, `info`, `notice`, `warning`, `error` or `critical`; anything else stops the command (exit 78)."
    ) { text throws(SettingValueError) in
        guard let level = Logger.Level(rawValue: text.lowercased()) else {
            throw SettingValueError("must be one of \(Logger.Level.valueNames) (got \"\(text)\")")
        }
        return level
    }
    package static let logFormat = Setting<LogFormat>.choice(
        "SIWA_LOG_FORMAT", flag: "log-format", .logging, default: .text, expected: "text or json",
        help: "text|json: key=value lines (values quoted when needed) or one JSON object per line",
        docs: "`text`: `key=value` lines, a value quoted (`\"…\"`, with `\\\"`, `\\\\` and control characters escaped) when it holds a space, `=`, `\"` or a control character, so no value from a request can forge a line or a key. `json`: one JSON object per line.")

    static let logging = [logLevel.info, logFormat.info]
}

/// How the process logs; every command reads these, also one that reads nothing else.
package struct LogSettings: Sendable {
    /// nil: the command's own default (`info` for `serve`, `warning` for one-shot commands).
    package var level: Logger.Level?
    package var format: LogFormat

    package init(_ source: SettingSource) throws(ConfigurationError) {
        level = try source.value(Settings.logLevel)
        format = try source.value(Settings.logFormat)
    }
}
