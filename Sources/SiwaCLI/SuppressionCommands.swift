import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaDomain
import SiwaStore

struct SuppressionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suppressions", abstract: "Addresses not to mail: each mail provider's lane, the snapshot, dead letters, the backfill.",
        subcommands: [List.self, Export.self, Retry.self, Sync.self])

    /// `--target`: a provider's name, or a message naming them.
    static func target(_ name: String) throws -> SuppressionTarget {
        guard let target = SuppressionTarget(rawValue: name.lowercased()) else {
            throw ValidationError("--target must be one of \(SuppressionTarget.allCases.map(\.rawValue).joined(separator: ", ")) (got \"\(name)\")")
        }
        return target
    }

    /// The apps: `--aud`, else SIWA_APPLE_BUNDLE_IDS.
    static func apps(_ aud: String?, _ settings: SettingSource) throws -> [String] {
        if let aud { return [aud] }
        let apps = try settings.value(Settings.bundleIDs)
        guard !apps.isEmpty else { throw ValidationError("set SIWA_APPLE_BUNDLE_IDS (--bundle-ids) to the apps whose addresses to read, or pass --aud") }
        return apps
    }

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Each provider's lane: pending, retrying, dead letters, last success; with --target, its operations.",
            discussion: """
                Examples:
                  siwa-events suppressions list
                  siwa-events suppressions list --target postmark --failed
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "A provider: postmark, sendgrid, mailgun, resend, ses.") var target: String?
        @Flag(help: "With --target: only operations retrying or discarded.") var failed = false
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            try ListFlags.checkLimit(limit)
            if let target { _ = try SuppressionsCommand.target(target) }
            if failed && target == nil { throw ValidationError("--failed goes with --target") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            guard let name = target else { return try await listTargets(database, logger) }
            let lane = Lane.suppressions(try SuppressionsCommand.target(name))
            let jobs = try await Database.with(database, logger: logger) { database in
                let queue = JobQueue(client: database.client, logger: logger)
                return failed
                    ? try await queue.list(lane: lane, state: .retryable, limit: limit) + queue.list(lane: lane, state: .discarded, limit: limit)
                    : try await queue.list(lane: lane, limit: limit)
            }
            if json {
                for job in jobs { print(job.json.jsonText) }
            } else if jobs.isEmpty {
                print("no operations match")
            } else {
                print(table(
                    ["ID", "STATE", "ATTEMPT", "ACTION", "APP", "ADDRESS", "RUN AT", "LAST ERROR"],
                    jobs.map { ["\($0.id)", $0.state.rawValue, "\($0.attempt)", $0.kind, $0.aud ?? "-", $0.target ?? "-", iso8601($0.runAt), $0.lastError ?? "-"] }))
            }
        }

        func listTargets(_ database: DatabaseSettings, _ logger: Logger) async throws {
            let targets = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).suppressionTargets()
            }
            if json {
                for t in targets {
                    print(JSONValue.object([
                        "target": .string(t.target.rawValue), "pending": .number(Double(t.pending)), "retrying": .number(Double(t.retrying)),
                        "discarded": .number(Double(t.discarded)), "last_success": t.lastSuccess.map { .string(iso8601($0)) } ?? .null,
                        "last_error": t.lastError.map(JSONValue.string) ?? .null,
                    ]).jsonText)
                }
                return
            }
            print(table(
                ["TARGET", "PENDING", "RETRYING", "DEAD LETTERS", "LAST SUCCESS", "LAST ERROR"],
                targets.map { ["\($0.target.rawValue)", "\($0.pending)", "\($0.retrying)", "\($0.discarded)", $0.lastSuccess.map(iso8601) ?? "never", $0.lastError ?? "-"] }))
        }
    }

    struct Export: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Every address suppressed now, for a provider's bulk import.",
            discussion: """
                csv is Mailgun's bounce import (header address,code,error,created_at); ses-csv and jsonl are
                an SES import job's source (address,BOUNCE lines; {"emailAddress","reason"} lines).

                Examples:
                  siwa-events suppressions export > suppressed.csv
                  siwa-events suppressions export --format ses-csv --aud com.example.app
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        enum Format: String, ExpressibleByArgument, CaseIterable { case csv, sesCSV = "ses-csv", jsonl }
        @Option(help: "csv (Mailgun), ses-csv or jsonl (SES import jobs).") var format: Format = .csv
        @Option(help: "One app (default: SIWA_APPLE_BUNDLE_IDS).") var aud: String?

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let apps = try SuppressionsCommand.apps(aud, settings)
            if format == .csv { print("address,code,error,created_at") }
            let rfc2822 = DateFormatter()
            rfc2822.locale = Locale(identifier: "en_US_POSIX")
            rfc2822.timeZone = TimeZone(identifier: "UTC")
            rfc2822.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'UTC'"
            try await Database.with(database, logger: logger) { database in
                let store = SuppressionStore(client: database.client, logger: logger)
                var after: SuppressionKey? = nil
                while true {
                    let page = try await store.suppressed(apps: apps, after: after, limit: 1_000)
                    for entry in page {
                        switch format {
                        case .csv: print("\(Self.csvField(entry.address)),550,\(entry.reason.rawValue),\"\(rfc2822.string(from: entry.eventTime))\"")
                        case .sesCSV: print("\(Self.csvField(entry.address)),BOUNCE")
                        case .jsonl: print(JSONValue.object(["emailAddress": .string(entry.address), "reason": .string("BOUNCE")]).jsonText)
                        }
                    }
                    guard page.count == 1_000, let last = page.last else { break }
                    after = SuppressionKey(aud: last.aud, address: last.address)
                }
            }
        }

        /// A CSV field, quoted when it holds a comma, a quote or a line break.
        static func csvField(_ text: String) -> String {
            guard text.contains(where: { $0 == "," || $0 == "\"" || $0.isNewline }) else { return text }
            return "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\""
        }
    }

    struct Retry: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Put an operation, or every dead letter of a provider, back: each sends its address's current state.",
            discussion: """
                Examples:
                  siwa-events suppressions retry --target postmark --discarded
                  siwa-events suppressions retry --target ses 42
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "A provider: postmark, sendgrid, mailgun, resend, ses.") var target: String
        @Argument(help: "The operation's id (see `suppressions list --target`).") var id: Int?
        @Flag(help: "Every dead letter of the provider.") var discarded = false

        func validate() throws {
            _ = try SuppressionsCommand.target(target)
            if (id == nil) == !discarded { throw ValidationError("give an operation id, or --discarded (not both)") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let target = try SuppressionsCommand.target(target)
            let count = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).retrySuppressions(target, id: id, discarded: discarded)
            }
            if count == 0, let id {
                printError("siwa-events: no operation \(id) of \(target.rawValue) to retry (unknown, completed, or running right now)")
                throw ExitCode(1)
            }
            print("queued \(count) operation\(count == 1 ? "" : "s") again, each with its address's current state")
        }
    }

    struct Sync: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Push every known address's current state to a provider (a team adopting this with history).",
            discussion: """
                Queues one operation per address, a chunk at a time, each chunk with the sync's cursor in one
                transaction: a killed run, started again, resumes where it stopped and queues no address twice.
                Paced by the provider: a chunk is queued once fewer than --backlog operations wait. A finished
                sync is not repeated without --restart.

                Examples:
                  siwa-events suppressions sync --target postmark
                  siwa-events suppressions sync --target ses --restart
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        @Option(help: "A provider: postmark, sendgrid, mailgun, resend, ses.") var target: String
        @Option(help: "Addresses per chunk.") var chunk: Int = 500
        @Option(help: "Queue the next chunk once fewer than this many operations wait.") var backlog: Int = 2_000
        @Flag(help: "Start again from the first address, even if a sync finished.") var restart = false

        func validate() throws {
            _ = try SuppressionsCommand.target(target)
            guard (1...10_000).contains(chunk) else { throw ValidationError("--chunk must be from 1 to 10000 (got \(chunk))") }
            guard backlog >= 1 else { throw ValidationError("--backlog must be at least 1 (got \(backlog))") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let target = try SuppressionsCommand.target(target)
            let apps = try SuppressionsCommand.apps(nil, settings)
            let (backlog, chunk, restart) = (self.backlog, self.chunk, self.restart)
            let result = try await Database.with(database, logger: logger) { database in
                let queue = JobQueue(client: database.client, logger: logger)
                let total = try await SuppressionStore(client: database.client, logger: logger).knownCount(apps: apps)
                let meter = ProgressLine(total: total)
                defer { meter.finish() }
                var sync = try await queue.syncSuppressions(target, apps: apps, limit: chunk, restart: restart)
                var added = sync.added
                meter.show(done: sync.queued)
                while sync.finished == nil {
                    while try await queue.openSuppressions(target) >= backlog { try await Task.sleep(for: .milliseconds(200)) }
                    sync = try await queue.syncSuppressions(target, apps: apps, limit: chunk)
                    added += sync.added
                    meter.show(done: sync.queued)
                }
                sync.added = added
                return sync
            }
            // Nothing queued by this run: an earlier one finished.
            if result.added == 0 && result.queued > 0 && !restart {
                print("\(target.rawValue): the sync finished at \(result.finished.map(iso8601) ?? "-") (\(result.queued) addresses queued); --restart pushes them again")
            } else {
                print("\(target.rawValue): \(result.queued) address\(result.queued == 1 ? "" : "es") queued; `suppressions list` shows them going out")
            }
        }
    }
}
