/// Every setting of siwa-events, each defined once beside the configuration that reads it (one file
/// per group in this folder). `all` is the order of `--help` and the configuration table of docs/reference.md.
package enum Settings {
    /// Every setting, group by group, in the order `--help` and docs/reference.md list them.
    package static let all: [SettingInfo] = database + apple + appleCredentials + listeners + process + history + jobs + accounts + callbacks + alerts + endpoint + suppressions + logging

    /// The setting a flag (without dashes) sets.
    package static func named(flag: String) -> SettingInfo? { all.first { $0.flag == flag } }
    /// The setting read from an environment variable.
    package static func named(variable: String) -> SettingInfo? { all.first { $0.variable == variable } }

    /// The lines of docs/reference.md between these markers are `markdownTable()` (a test compares).
    package static let tableMarkers = (begin: "<!-- settings table: generated from Sources/SiwaApp/Settings/ -->", end: "<!-- end of settings table -->")

    /// The configuration reference of docs/reference.md: one row per setting, in `all`'s order; a
    /// secret's row names its `_FILE` variable too. A setting's `docs` writes a link from the
    /// repository's root (`docs/reference.md#callbacks`); the table, in docs/, links from there.
    package static func markdownTable() -> String {
        var lines = ["| Variable | Flag | Default | Meaning |", "|---|---|---|---|"]
        for setting in all {
            let variable = setting.fileVariable.map { "`\(setting.variable)` or `\($0)` (secret)" } ?? "`\(setting.variable)`"
            let docs = setting.docs.replacing("](docs/reference.md#", with: "](#").replacing("](docs/", with: "](")
            lines.append("| \(variable) | `--\(setting.flag)` | \(setting.shownDefault) | \(docs) |")
        }
        return lines.joined(separator: "\n")
    }
}
