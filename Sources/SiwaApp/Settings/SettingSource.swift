#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Configuration
import Foundation

/// A setting that could not be used: names the variable (and its flag) and what is expected.
package struct ConfigurationError: Error, CustomStringConvertible {
    package let variable: String
    package let message: String
    package var description: String { "\(variable): \(message)" }

    package init(variable: String, message: String) {
        self.variable = variable
        self.message = message
    }
}

/// Where settings are read: flags first, then the environment, through swift-configuration's
/// `ConfigReader`. Each setting's key is its variable name; the command-line provider maps it to
/// the setting's flag.
package struct SettingSource: Sendable {
    private let reader: ConfigReader

    /// `arguments`: the settings' flags from the command line (`--port=8080` or `--port 8080`).
    /// A secret's `_FILE` variable is read here (`readingSecretFiles`): a file that cannot be used
    /// is an error at once.
    package init(environment: [String: String], arguments: [String] = []) throws(ConfigurationError) {
        let environment = try Self.readingSecretFiles(environment)
        let secrets = Set(Settings.all.filter(\.secret).map(\.variable))
        let flags = Dictionary(uniqueKeysWithValues: Settings.all.map { ($0.variable, $0.flag) })
        // Each provider is asked for a string array and the parts joined again: the command-line
        // provider splits values at commas, and the environment's separator is one no value holds.
        let commandLine = CommandLineArgumentsProvider(
            arguments: ["siwa-events"] + arguments,
            secretsSpecifier: .dynamic { key, _ in secrets.contains(flags.first { "--\($0.value)" == key }?.key ?? "") }
        ).mapKeys { key in AbsoluteConfigKey([flags[key.components.joined()] ?? "unknown-\(key.components.joined())"]) }
        self.reader = ConfigReader(providers: [
            commandLine,
            EnvironmentVariablesProvider(environmentVariables: environment, secretsSpecifier: .specific(secrets), arraySeparator: "\u{0}"),
        ])
    }

    /// `environment` with each secret's `_FILE` variable (`SIWA_CALLBACK_SECRET_FILE=/run/secrets/x`)
    /// replaced by the file's contents, a trailing newline trimmed, under the secret's own variable.
    /// Both variables set, or a file that cannot be read or is empty, is an error naming the
    /// variables and the path. A flag still wins over either, as over any variable.
    package static func readingSecretFiles(_ environment: [String: String]) throws(ConfigurationError) -> [String: String] {
        var environment = environment
        for setting in Settings.all {
            guard let fileVariable = setting.fileVariable, let path = environment[fileVariable], !path.trimmingCharacters(in: .whitespaces).isEmpty else {
                continue
            }
            if let value = environment[setting.variable], !value.trimmingCharacters(in: .whitespaces).isEmpty {
                throw ConfigurationError(
                    variable: "\(setting.variable) and \(fileVariable)",
                    message: "are both set: set only \(fileVariable) (the file keeps the secret out of the environment) and unset \(setting.variable)")
            }
            let contents: String
            do {
                contents = try SecretFile.contents(of: path)
            } catch {
                throw ConfigurationError(
                    variable: fileVariable, message: "cannot read \(path) (\(error.reason)): point it at a file holding \(setting.variable)'s value that this user can read")
            }
            var value = Substring(contents)
            while let last = value.last, last.isNewline { value.removeLast() }
            guard !value.trimmingCharacters(in: .whitespaces).isEmpty else {
                throw ConfigurationError(variable: fileVariable, message: "\(path) is empty: write \(setting.variable)'s value into it")
            }
            environment[setting.variable] = String(value)
            environment[fileVariable] = nil
        }
        return environment
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

/// Reads a secret's file whole (the `_FILE` variables), saying why it cannot in the system's words.
enum SecretFile {
    struct Unreadable: Error {
        let reason: String
    }

    /// Larger than any secret or URL: a path to the wrong file is refused, not read into memory.
    static let maximumSize = 64 * 1024

    static func contents(of path: String) throws(Unreadable) -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw Unreadable(reason: String(cString: strerror(errno))) }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw Unreadable(reason: String(cString: strerror(errno)))
            }
            if count == 0 { break }
            bytes.append(contentsOf: buffer[..<count])
            guard bytes.count <= maximumSize else { throw Unreadable(reason: "larger than \(maximumSize / 1024) KiB, not a secret") }
        }
        guard let text = String(validating: bytes, as: UTF8.self) else { throw Unreadable(reason: "not UTF-8 text") }
        return text
    }
}
