import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaRuntime
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
            Serve.self, Migrate.self, NotificationsCommand.self, RejectionsCommand.self, JobsCommand.self, CallbacksCommand.self, AlertsCommand.self, ReplayCommand.self, TokensCommand.self, AccountsCommand.self, SuppressionsCommand.self, AppleCommand.self, TransfersCommand.self, AuditCommand.self,
            DatabaseCommand.self, Verify.self, Doctor.self, Healthcheck.self,
            KeysCommand.self, Send.self, StandInCommand.self,
        ])
}

/// One logger for the process: structured lines on stderr, level and format from SIWA_LOG_LEVEL and
/// SIWA_LOG_FORMAT (default level `info` for `serve`, `warning` for one-shot commands, whose output
/// is their result). A bad value stops the command (exit 78) naming the variable.
func makeLogger(_ settings: SettingSource, defaultLevel: Logger.Level = .warning) throws(ConfigurationError) -> Logger {
    let logging = try LogSettings(settings)
    let level = logging.level ?? defaultLevel
    LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: logging.format) }
    return Logger(label: "siwa-events")
}

/// Prints to stderr (progress and diagnostics; stdout is for results).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

struct Serve: SettingsCommand {
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

    func run(_ settings: SettingSource) async throws {
        try await Server.serve(try Configuration(settings), logger: try makeLogger(settings, defaultLevel: .info))
    }
}

struct Migrate: SettingsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply pending database migrations from sql/ (built in).",
        discussion: """
            `serve` applies them itself unless SIWA_MIGRATE_ON_START=false.

            Examples:
              DATABASE_URL=postgres://siwa:secret@db:5432/siwa siwa-events migrate
            """)
    static let settingGroups: [SettingGroup] = [.database, .logging]

    func run(_ settings: SettingSource) async throws {
        let database = try DatabaseSettings(settings)
        let logger = try makeLogger(settings)
        let applied = try await Database.with(database, logger: logger, creating: true) { database in
            try await Migrator(client: database.client, logger: logger).migrate()
        }
        print(applied.isEmpty ? "schema is up to date" : "applied migrations: \(applied.map(String.init).joined(separator: ", "))")
    }
}
