import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import SiwaApp

/// A command that reads settings: the groups it declares are the only settings it reads, from flags
/// (another's flag is an unknown option) or the environment, and the ones its `--help` lists.
/// `main()` runs it with the settings of this invocation.
protocol SettingsCommand: ParsableCommand {
    static var settingGroups: [SettingGroup] { get }
    func run(_ settings: SettingSource) async throws
}

/// The settings' flags, taken off the command line before ArgumentParser parses the rest
/// (ArgumentParser cannot declare options from a list; swift-configuration reads them).
enum CommandLineSettings {
    /// `arguments` (`--flag=value`, from `split`) first, then the environment (a secret's `_FILE`
    /// variable read). Only `groups`' variables are read, so one exported for `serve` (e.g. a lone
    /// SIWA_CALLBACK_SECRET) does not stop `tokens create`.
    static func source(arguments: [String], groups: [SettingGroup]) throws(ConfigurationError) -> SettingSource {
        var environment = ProcessInfo.processInfo.environment
        for setting in Settings.all where !groups.contains(setting.group) {
            environment[setting.variable] = nil
            if let fileVariable = setting.fileVariable { environment[fileVariable] = nil }
        }
        return try SettingSource(environment: environment, arguments: arguments)
    }

    /// The command the words name (`notifications list`), and whether help was asked for.
    static func command(_ arguments: [String]) -> (command: any ParsableCommand.Type, path: [String], help: Bool) {
        var words = arguments[...]
        var help = false
        if words.first == "help" {
            help = true
            words = words.dropFirst()
        }
        var command: any ParsableCommand.Type = SiwaEvents.self
        var path = [SiwaEvents._commandName]
        for word in words {
            guard let next = command.configuration.subcommands.first(where: { $0._commandName == word }) else { break }
            command = next
            path.append(word)
        }
        let beforeTerminator = arguments.prefix { $0 != "--" }
        return (command, path, help || beforeTerminator.contains("--help") || beforeTerminator.contains("-h"))
    }

    /// Splits `arguments` into the flags of settings in `groups` (as `--flag=value`) and the rest,
    /// so a command's own option may share a name with a setting of another group.
    static func split(_ arguments: [String], groups: [SettingGroup]) throws(MissingValue) -> (settings: [String], rest: [String]) {
        var values: [(flag: String, value: String)] = []
        var rest: [String] = []
        var index = arguments.startIndex
        while index < arguments.endIndex {
            let argument = arguments[index]
            index += 1
            if argument == "--" {
                rest.append(contentsOf: arguments[(index - 1)...])
                break
            }
            guard argument.hasPrefix("--") else {
                rest.append(argument)
                continue
            }
            let body = argument.dropFirst(2)
            let flag = String(body.prefix { $0 != "=" })
            guard let setting = Settings.named(flag: flag), groups.contains(setting.group) else {
                rest.append(argument)
                continue
            }
            if let equals = body.firstIndex(of: "=") {
                values.append((flag, String(body[body.index(after: equals)...])))
            } else if index < arguments.endIndex {
                values.append((flag, arguments[index]))
                index += 1
            } else {
                throw MissingValue(flag: flag)
            }
        }
        var seen = Set<String>()
        let last = values.reversed().filter { seen.insert($0.flag).inserted }.reversed()
        return (last.map { "--\($0.flag)=\($0.value)" }, rest)
    }

    /// A setting's flag last on the command line, with no value after it.
    struct MissingValue: Error {
        let flag: String
    }

    /// The settings part of a command's `--help`: its groups, each setting with its flag, what it
    /// does, its variable and its default.
    static func help(for groups: [SettingGroup], width: Int = 80) -> String {
        var lines: [String] = []
        for group in groups {
            let settings = Settings.all.filter { $0.group == group }
            guard !settings.isEmpty else { continue }
            lines.append("")
            lines.append("\(group.title.uppercased()) SETTINGS (environment variable, or the flag):")
            for setting in settings {
                let label = "  --\(setting.flag) <value>"
                let shownDefault = setting.shownDefault.replacingOccurrences(of: "`", with: "")
                var text = "\(setting.help.prefix(1).uppercased())\(setting.help.dropFirst()) (\(setting.variable); default: \(shownDefault))"
                if let fileVariable = setting.fileVariable {
                    text += ". A secret: other local users can read a flag (ps, /proc); prefer \(fileVariable), a file holding it"
                }
                let wrapped = wrap(text, width: width - 26)
                if label.count <= 24 {
                    lines.append(label.padding(toLength: 26, withPad: " ", startingAt: 0) + wrapped[0])
                    lines.append(contentsOf: wrapped.dropFirst().map { String(repeating: " ", count: 26) + $0 })
                } else {
                    lines.append(label)
                    lines.append(contentsOf: wrapped.map { String(repeating: " ", count: 26) + $0 })
                }
            }
        }
        return lines.joined(separator: "\n")
    }

    private static func wrap(_ text: String, width: Int) -> [String] {
        var lines: [String] = []
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty && line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += line.isEmpty ? String(word) : " " + word
        }
        return lines + [line]
    }
}

extension SiwaEvents {
    /// ArgumentParser's entry point, with the settings' flags taken off first and the settings of
    /// the command's groups added to its `--help`.
    ///
    /// First, Swift concurrency's jobs are set to run on NIO's event loops, the threads that already
    /// carry HTTP and PostgreSQL: a handler resumed by a request's bytes or a query's answer goes on
    /// where they arrived, instead of being handed to the cooperative pool and back.
    static func main() async {
        NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        let arguments = Array(CommandLine.arguments.dropFirst())
        let (command, path, help) = CommandLineSettings.command(arguments)
        guard let reader = command as? any SettingsCommand.Type else {
            await runParsed(arguments)
        }
        if help {
            print(helpMessage(for: command).trimmingCharacters(in: .newlines))
            print(CommandLineSettings.help(for: reader.settingGroups))
            return
        }
        do {
            let (settings, rest) = try CommandLineSettings.split(arguments, groups: reader.settingGroups)
            await runParsed(rest, settings: settings)
        } catch {
            // Worded and numbered as ArgumentParser's own usage errors.
            printError("Error: Missing value for '--\(error.flag) <value>'\n  See '\(path.joined(separator: " ")) --help' for more information.")
            Foundation.exit(ExitCode.validationFailure.rawValue)
        }
    }

    /// Parses `arguments` and runs the command; a `SettingsCommand` with its groups' settings
    /// (`settings`: their flags).
    private static func runParsed(_ arguments: [String], settings: [String] = []) async -> Never {
        do {
            var command = try parseAsRoot(arguments)
            if let command = command as? any SettingsCommand {
                try await command.run(CommandLineSettings.source(arguments: settings, groups: type(of: command).settingGroups))
            } else if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
            exit(withError: nil)
        } catch let error as ConfigurationError {
            // A setting (or a secret's file) that cannot be used, the database refusing DATABASE_URL,
            // or a listener's address in use.
            printError("siwa-events: \(error.description)")
            Foundation.exit(78)  // EX_CONFIG
        } catch let error as DatabaseUnreachable {
            printError("siwa-events: \(error.description)")
            Foundation.exit(69)  // EX_UNAVAILABLE
        } catch {
            exit(withError: error)
        }
    }
}
