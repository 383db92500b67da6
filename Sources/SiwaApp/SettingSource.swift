import Configuration
import Foundation

/// Where settings are read: flags first, then the environment, through swift-configuration's
/// `ConfigReader`. Each setting's key is its variable name; the command-line provider maps it to
/// the setting's flag.
package struct SettingSource: Sendable {
    private let reader: ConfigReader

    /// `arguments`: the settings' flags from the command line (`--port=8080` or `--port 8080`);
    /// `overrides`: values keyed by variable name that win over both (tests).
    package init(environment: [String: String], arguments: [String] = [], overrides: [String: String] = [:]) {
        let secrets = Set(Settings.all.filter(\.secret).map(\.variable))
        let flags = Dictionary(uniqueKeysWithValues: Settings.all.map { ($0.variable, $0.flag) })
        // Each provider is asked for a string array and the parts joined again: the command-line
        // provider splits values at commas, and the environment's separator is one no value holds.
        let commandLine = CommandLineArgumentsProvider(
            arguments: ["siwa-events"] + arguments,
            secretsSpecifier: .dynamic { key, _ in secrets.contains(flags.first { "--\($0.value)" == key }?.key ?? "") }
        ).mapKeys { key in AbsoluteConfigKey([flags[key.components.joined()] ?? "unknown-\(key.components.joined())"]) }
        self.reader = ConfigReader(providers: [
            InMemoryProvider(
                name: "overrides",
                values: Dictionary(uniqueKeysWithValues: overrides.map { (AbsoluteConfigKey([$0.key]), ConfigValue(.stringArray([$0.value]), isSecret: secrets.contains($0.key))) })),
            commandLine,
            EnvironmentVariablesProvider(environmentVariables: environment, secretsSpecifier: .specific(secrets), arraySeparator: "\u{0}"),
        ])
    }

    /// The setting's text, trimmed; nil when unset or blank.
    package func text(_ info: SettingInfo) -> String? {
        guard let parts = reader.stringArray(forKey: ConfigKey([info.variable]), isSecret: info.secret) else { return nil }
        let text = parts.joined(separator: ",").trimmingCharacters(in: .whitespaces)
        return text.isEmpty ? nil : text
    }

    /// The setting's value: its default when unset, else the parsed text; a value that does not
    /// parse is an error naming the variable and its flag.
    package func value<Value>(_ setting: Setting<Value>) throws(ConfigurationError) -> Value {
        guard let text = text(setting.info) else { return setting.defaultValue }
        do {
            return try setting.parse(text)
        } catch {
            throw ConfigurationError(variable: setting.info.name, message: error.message)
        }
    }
}
