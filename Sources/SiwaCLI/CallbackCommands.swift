import ArgumentParser
import Foundation
import SiwaApp
import SiwaDomain
import SiwaStore

struct CallbacksCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "callbacks", abstract: "Callbacks to your backend (SIWA_CALLBACK_URL): inspect, redeliver, make a secret.",
        subcommands: [List.self, Redeliver.self, Secret.self])

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List callbacks, newest first.",
            discussion: """
                Examples:
                  siwa-events callbacks list
                  siwa-events callbacks list --failed --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Flag(help: "Only callbacks not delivered after an attempt (retrying or discarded).") var failed = false
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws { try ListFlags.checkLimit(limit) }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let callbacks = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).listCallbacks(failed: failed, limit: limit)
            }
            if json {
                for item in callbacks {
                    print(JSONValue.object([
                        "id": .number(Double(item.id)), "webhook_id": .string(item.webhookID), "state": .string(item.state.rawValue),
                        "attempt": .number(Double(item.attempt)), "jti": .string(item.jti), "aud": item.aud.map(JSONValue.string) ?? .null,
                        "type": item.type.map(JSONValue.string) ?? .null, "created_at": .string(iso8601(item.createdAt)),
                        "next_attempt_at": item.state == .retryable ? .string(iso8601(item.runAt)) : .null,
                        "finished_at": item.finishedAt.map { .string(iso8601($0)) } ?? .null,
                        "last_status": item.lastStatus.map { .number(Double($0)) } ?? .null,
                        "last_error": item.lastError.map(JSONValue.string) ?? .null,
                    ]).jsonText)
                }
            } else if callbacks.isEmpty {
                print(failed ? "no failed callbacks" : "no callbacks")
            } else {
                print(table(
                    ["WEBHOOK ID", "STATE", "ATTEMPT", "TYPE", "CREATED", "LAST STATUS", "LAST ERROR", "JOB"],
                    callbacks.map {
                        [$0.webhookID, $0.state.rawValue, "\($0.attempt)", $0.type ?? "-", iso8601($0.createdAt),
                         $0.lastStatus.map(String.init) ?? "-", $0.lastError ?? "-", "\($0.id)"]
                    }))
            }
        }
    }

    struct Redeliver: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send a callback again (same webhook-id), or every callback created since a time.",
            discussion: """
                Examples:
                  siwa-events callbacks redeliver msg_12
                  siwa-events callbacks redeliver --since 2h
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Argument(help: "The callback's webhook-id (msg_12, as your backend saw it), or its job id (see `callbacks list`).")
        var id: String?
        @Option(help: "Every callback created since this time: ISO-8601 (2026-11-21T08:00:00Z) or a duration ago (2h).")
        var since: String?

        /// The argument as a job id or as the notification its webhook-id names.
        private var target: (job: Int?, notification: Int?) {
            guard let id else { return (nil, nil) }
            return (Int(id).flatMap { $0 > 0 ? $0 : nil }, JobQueue.notificationID(webhookID: id))
        }

        func validate() throws {
            if (id == nil) == (since == nil) { throw ValidationError("give a callback id, or --since (not both)") }
            if let id, target.job == nil, target.notification == nil {
                throw ValidationError("give a webhook-id like msg_12 (or a job id like 11), as `callbacks list` shows (got \"\(id)\")")
            }
            if let since, parseSince(since, now: Date()) == nil {
                throw ValidationError("--since must be an ISO-8601 time like 2026-11-21T08:00:00Z or a duration like 2h (got \"\(since)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let from = since.flatMap { parseSince($0, now: Date()) }
            let count = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).redeliverCallbacks(
                    id: target.job, notificationID: target.notification, since: from)
            }
            if count == 0, let id {
                printError("siwa-events: no callback \(id) to redeliver (unknown id, or being delivered right now; see `callbacks list`)")
                throw ExitCode(1)
            }
            print("queued \(count) callback\(count == 1 ? "" : "s") for delivery")
        }
    }

    struct Secret: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a new signing secret for SIWA_CALLBACK_SECRET (whsec_…). To rotate, set \"NEW OLD\", then drop OLD.",
            discussion: """
                Examples:
                  SIWA_CALLBACK_SECRET=$(siwa-events callbacks secret)
                """)

        func run() {
            print(WebhookSigner.generateSecret())
        }
    }
}

/// `--since`: an ISO-8601 time, or a duration meaning that long before `now`.
func parseSince(_ text: String, now: Date) -> Date? {
    if let date = try? Date(text, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true)) { return date }
    if let date = try? Date(text, strategy: .iso8601) { return date }
    if let duration = try? DurationSyntax.parse(text) { return now.addingTimeInterval(-duration.timeInterval) }
    return nil
}
