import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaStore

@main
struct SiwaEvents: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "siwa-events",
        abstract: "Receive, verify and record Sign in with Apple server-to-server notifications.",
        discussion: """
            Examples:
              siwa-events serve --bundle-ids com.example.app
              siwa-events notifications list
              siwa-events tokens create --name backend --scope sessions:write
              siwa-events <command> --help
            """,
        subcommands: [
            Serve.self, Migrate.self, NotificationsCommand.self, RejectionsCommand.self, JobsCommand.self, CallbacksCommand.self, AlertsCommand.self, ReplayCommand.self, TokensCommand.self, AccountsCommand.self, AuditCommand.self,
            DatabaseCommand.self, Verify.self, Doctor.self, Healthcheck.self,
            KeysCommand.self, Send.self,
        ])
}

/// The settings a command reads, from the environment or their flags (`SettingsCommandLine.swift`
/// takes the flags off the command line before ArgumentParser sees the rest).
struct ConfigOptions: ParsableArguments {
    /// Every setting, checked; a bad value stops the command with exit 78 naming the variable and flag.
    func load(requireBundleIDs: Bool) throws -> Configuration {
        do {
            return try Configuration.load(CommandLineSettings.source(), requireBundleIDs: requireBundleIDs)
        } catch {
            printError("siwa-events: \(error.description)")
            throw ExitCode(78)  // EX_CONFIG
        }
    }
}

/// One logger for the process: structured lines on stderr, level and format from SIWA_LOG_LEVEL and
/// SIWA_LOG_FORMAT (default level `info` for `serve`, `warning` for one-shot commands, whose output
/// is their result). A bad value stops the command (exit 78) naming the variable.
func makeLogger(_ label: String = "siwa-events", defaultLevel: Logger.Level = .warning) throws -> Logger {
    let settings: Configuration.LogSettings
    do {
        settings = try Configuration.logging(CommandLineSettings.source())
    } catch {
        printError("siwa-events: \(error.description)")
        throw ExitCode(78)  // EX_CONFIG
    }
    let level = settings.level ?? defaultLevel
    LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: settings.format) }
    return Logger(label: label)
}

/// Prints to stderr (progress and diagnostics; stdout is for results).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

struct Serve: AsyncParsableCommand, ReadsSettings {
    static let configuration = CommandConfiguration(
        abstract: "Run the receiver (embedded PostgreSQL unless DATABASE_URL is set).",
        discussion: """
            Without DATABASE_URL it runs an embedded PostgreSQL in ./.siwa (SIWA_DATA_DIR); the other commands find it there when run from the same directory.

            Examples:
              siwa-events serve --bundle-ids com.example.app
              DATABASE_URL=postgres://siwa:secret@db:5432/siwa siwa-events serve
              siwa-events serve --role worker --workers 8
            """)
    static let settingGroups = SettingGroup.allCases
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        let config = try options.load(requireBundleIDs: true)
        do {
            try await Server.serve(config, logger: try makeLogger(defaultLevel: .info))
        } catch let error as ConfigurationError {
            // Found only when opening the database (DATABASE_URL refused or missing with
            // SIWA_EMBEDDED_DATABASE=off) or binding (a port in use): a configuration error all the same.
            printError("siwa-events: \(error.description)")
            throw ExitCode(78)  // EX_CONFIG
        }
    }
}

struct Migrate: AsyncParsableCommand, ReadsSettings {
    static let configuration = CommandConfiguration(
        abstract: "Apply pending database migrations from sql/ (built in).",
        discussion: """
            `serve` applies them itself unless SIWA_MIGRATE_ON_START=false.

            Examples:
              DATABASE_URL=postgres://siwa:secret@db:5432/siwa siwa-events migrate
            """)
    static let settingGroups: [SettingGroup] = [.database, .logging]
    @OptionGroup var options: ConfigOptions

    func run() async throws {
        let config = try options.load(requireBundleIDs: false)
        let logger = try makeLogger()
        let applied = try await Database.with(config, logger: logger, creating: true) { database in
            try await Migrator(client: database.client, logger: logger).migrate()
        }
        print(applied.isEmpty ? "schema is up to date" : "applied migrations: \(applied.map(String.init).joined(separator: ", "))")
    }
}
