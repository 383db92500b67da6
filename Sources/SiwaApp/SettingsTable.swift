/// The README's configuration reference, made from the settings' definitions (a test compares).
extension Settings {
    /// The README lines between these markers are `markdownTable()`.
    package static let tableMarkers = (begin: "<!-- settings table: generated from Sources/SiwaApp/Settings.swift -->", end: "<!-- end of settings table -->")

    /// One row per setting, in `all`'s order; a secret's row names its `_FILE` variable too.
    package static func markdownTable() -> String {
        var lines = ["| Variable | Flag | Default | Meaning |", "|---|---|---|---|"]
        for setting in all {
            let variable = setting.fileVariable.map { "`\(setting.variable)` or `\($0)` (secret)" } ?? "`\(setting.variable)`"
            lines.append("| \(variable) | `--\(setting.flag)` | \(setting.shownDefault) | \(setting.docs) |")
        }
        return lines.joined(separator: "\n")
    }
}
