/// The README's configuration reference, made from the settings' definitions (a test compares).
extension Settings {
    /// The README lines between these markers are `markdownTable()`.
    package static let tableMarkers = (begin: "<!-- settings table: generated from Sources/SiwaApp/Settings.swift -->", end: "<!-- end of settings table -->")

    /// One row per setting, in `all`'s order.
    package static func markdownTable() -> String {
        var lines = ["| Variable | Flag | Default | Meaning |", "|---|---|---|---|"]
        for setting in all {
            lines.append("| `\(setting.variable)` | `--\(setting.flag)` | \(setting.shownDefault) | \(setting.docs) |")
        }
        return lines.joined(separator: "\n")
    }
}
