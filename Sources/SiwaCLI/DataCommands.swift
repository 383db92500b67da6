import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaDomain
import SiwaHTTP
import SiwaStore

struct NotificationsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notifications", abstract: "Query recorded notifications.",
        subcommands: [List.self, Show.self, Timeline.self, Export.self, Stats.self])

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List notifications, newest first.",
            discussion: """
                Examples:
                  siwa-events notifications list
                  siwa-events notifications list --type consent-revoked --limit 20
                  siwa-events notifications list --sub 001234.abcd --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "Only this user (Apple's team-scoped sub).") var sub: String?
        @Option(help: "Only this bundle ID.") var aud: String?
        @Option(help: "Only this type: \(EventType.valueNames).") var type: String?
        @Option(help: "Only this status: pending, applied, skipped, retrying, discarded.") var status: String?
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            try ListFlags.checkTypes(type.map { [$0] } ?? [])
            try ListFlags.checkStatuses(status.map { [$0] } ?? [])
            try ListFlags.checkLimit(limit)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let filter = NotificationFilter(sub: sub, aud: aud, type: type.map { ListFlags.canonical([$0])[0] }, status: status.flatMap(ProcessingStatus.init), limit: limit)
            let items = try await Database.with(database, logger: logger) { database in
                try await NotificationStore(client: database.client, logger: logger).list(filter)
            }
            if json {
                for item in items { print(item.json.jsonText) }
            } else if items.isEmpty {
                print("no notifications match")
            } else {
                print(table(
                    ["RECEIVED", "TYPE", "STATUS", "AUD", "SUB", "EVENT TIME", "DELIVERIES", "JTI"],
                    items.map {
                        [iso8601($0.receivedAt), $0.type ?? "-", $0.status.rawValue + ($0.skipReason.map { " (\($0))" } ?? ""), $0.aud,
                         $0.sub ?? "-", $0.eventTime.map(iso8601) ?? "-", "\($0.deliveries)", $0.jti]
                    }))
            }
        }
    }
}

extension NotificationsCommand {
    struct Show: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "One notification: verification facts, deliveries and every attempt.",
            discussion: """
                Examples:
                  siwa-events notifications show 5f8c1f0e-jti-from-the-list
                  siwa-events notifications show 5f8c1f0e-jti-from-the-list --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Argument(help: "The notification's jti.") var jti: String
        @Flag(help: "JSON, as GET /v1/notifications/{jti} answers.") var json = false

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let detail = try await Database.with(database, logger: logger) { database in
                try await HistoryStore(client: database.client, logger: logger).notification(jti: jti)
            }
            guard let detail else {
                printError("siwa-events: no notification with jti \(jti)")
                throw ExitCode(1)
            }
            if json {
                print(detail.json.jsonText)
                return
            }
            let record = detail.record
            print(table(["FIELD", "VALUE"], [
                ["jti", record.jti], ["type", record.type ?? "-"], ["status", record.status + (record.skipReason.map { " (\($0))" } ?? "")],
                ["aud", record.aud], ["sub", record.sub ?? "-"], ["event time", record.eventTime.map(iso8601) ?? "-"],
                ["received", iso8601(record.receivedAt)], ["deliveries", "\(record.deliveries)"], ["kid", detail.kid],
                ["iat", iso8601(detail.issuedAt)], ["erased", record.erasedAt.map(iso8601) ?? "-"],
            ]))
            print("")
            print(detail.attempts.isEmpty ? "no attempts yet" : table(
                ["WEBHOOK ID", "LANE", "ATTEMPT", "OUTCOME", "EFFECT", "FINISHED", "WORKER", "ERROR"],
                detail.attempts.map {
                    [$0.lane == .callbacks ? JobQueue.webhookID(notificationID: record.id) : "-", $0.lane.rawValue, "\($0.attempt)", $0.outcome.rawValue + ($0.httpStatus.map { " (HTTP \($0))" } ?? ""), $0.effect ?? "-",
                     iso8601($0.finishedAt), $0.worker, $0.error ?? "-"]
                }))
        }
    }

    struct Timeline: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "A user's notifications in event_time order, with what each changed.",
            discussion: """
                Examples:
                  siwa-events notifications timeline --aud com.example.app --sub 001234.abcd
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "The app's bundle ID.") var aud: String
        @Option(help: "Apple's user identifier.") var sub: String
        @Flag(help: "One JSON object per line.") var json = false

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let entries = try await Database.with(database, logger: logger) { database in
                try await HistoryStore(client: database.client, logger: logger).timeline(aud: aud, sub: sub, limit: ListLimit.maximum)
            }
            if json {
                for entry in entries { print(entry.json.jsonText) }
            } else if entries.isEmpty {
                print("nothing recorded for \(aud)/\(sub)")
            } else {
                print(table(
                    ["EVENT TIME", "TYPE", "STATUS", "EFFECT", "REVOKED", "RECEIVED", "JTI"],
                    entries.map {
                        [$0.record.eventTime.map(iso8601) ?? "-", $0.record.type ?? "-", $0.record.status, $0.effect ?? "-",
                         $0.revokedSessions.map(String.init) ?? "-", iso8601($0.record.receivedAt), $0.record.jti]
                    }))
            }
        }
    }

    struct Export: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Stream notifications as NDJSON (newest first), with progress on stderr.",
            discussion: """
                Examples:
                  siwa-events notifications export --output notifications.ndjson
                  siwa-events notifications export --type account-delete > deleted.ndjson
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "Only this bundle ID.") var aud: String?
        @Option(help: "Only this user.") var sub: String?
        @Option(help: "Only these types (repeat): \(EventType.valueNames).") var type: [String] = []
        @Option(help: "Only these statuses (repeat).") var status: [String] = []
        @Option(help: "From this ISO-8601 time (inclusive).") var from: String?
        @Option(help: "To this ISO-8601 time (exclusive).") var to: String?
        @Option(name: .customLong("time-field"), help: "received_at (default) or event_time.") var timeField: String = "received_at"
        @Option(help: "Write here instead of stdout.") var output: String?

        func validate() throws {
            if HistoryQuery.TimeField(rawValue: timeField) == nil { throw ValidationError("--time-field must be received_at or event_time (got \"\(timeField)\")") }
            try ListFlags.checkTypes(type)
            try ListFlags.checkStatuses(status)
            for (flag, value) in [("--from", from), ("--to", to)] where value != nil && parseSince(value!, now: Date()) == nil {
                throw ValidationError("\(flag) must be an ISO-8601 time like 2026-11-21T08:00:00Z (got \"\(value!)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            var query = HistoryQuery()
            query.aud = aud
            query.sub = sub
            query.types = type.map { EventType(apple: $0)?.rawValue ?? $0 }
            query.statuses = status
            query.timeField = HistoryQuery.TimeField(rawValue: timeField)!
            query.from = from.flatMap { parseSince($0, now: Date()) }
            query.to = to.flatMap { parseSince($0, now: Date()) }
            query.limit = ListLimit.maximum
            let first = query
            // Email addresses: readable by its owner only, and the file is replaced only by a whole export.
            var file: PrivateFile?
            if let output {
                do {
                    file = try PrivateFile(creating: output)
                } catch {
                    printError("siwa-events: --output: \(error)")
                    throw ExitCode(1)
                }
            }
            let handle = file?.handle ?? .standardOutput
            let started = Date()
            let total: Int
            do {
                total = try await export(first, to: handle, database: database, logger: logger)
                try file?.commit()
            } catch {
                file?.discard()
                throw error
            }
            printError("exported \(total) notifications in \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
        }

        /// Writes every notification `first` selects to `handle`, a page at a time; the count.
        private func export(_ first: HistoryQuery, to handle: FileHandle, database: DatabaseSettings, logger: Logger) async throws -> Int {
            try await Database.with(database, logger: logger) { database in
                let store = HistoryStore(client: database.client, logger: logger)
                var query = first
                var count = 0
                var lastReport = 0
                while true {
                    let page = try await store.notifications(query)
                    var chunk: [UInt8] = []
                    for record in page {
                        chunk.append(contentsOf: record.json.jsonText.utf8)
                        chunk.append(UInt8(ascii: "\n"))
                    }
                    try handle.write(contentsOf: chunk)
                    count += page.count
                    if count - lastReport >= 10_000 {
                        lastReport = count
                        printError("exported \(count) notifications…")
                    }
                    guard page.count == query.limit, let last = page.last else { break }
                    query.after = (last.sortMicros, last.id)
                }
                return count
            }
        }
    }

    struct Stats: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Notifications per time bucket and type.",
            discussion: """
                Examples:
                  siwa-events notifications stats
                  siwa-events notifications stats --bucket day --from 7d --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "minute, hour (default) or day.") var bucket: String = "hour"
        @Option(help: "From this time: ISO-8601 or a duration ago (default: 1h, 7d or 90d before --to).") var from: String?
        @Option(help: "To this ISO-8601 time (default: now).") var to: String?
        @Option(help: "Only this bundle ID.") var aud: String?
        @Option(help: "Only these types (repeat): \(EventType.valueNames).") var type: [String] = []
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            if HistoryStore.buckets[bucket] == nil { throw ValidationError("--bucket must be minute, hour or day (got \"\(bucket)\")") }
            try ListFlags.checkTypes(type)
            for (flag, value) in [("--from", from), ("--to", to)] where value != nil && parseSince(value!, now: Date()) == nil {
                throw ValidationError("\(flag) must be an ISO-8601 time like 2026-11-21T08:00:00Z or a duration like 2h (got \"\(value!)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let end = to.flatMap { parseSince($0, now: Date()) } ?? Date()
            let start = from.flatMap { parseSince($0, now: end) } ?? end.addingTimeInterval(-HistoryStore.buckets[bucket]!.defaultRange)
            let rows = try await Database.with(database, logger: logger) { database in
                try await HistoryStore(client: database.client, logger: logger).stats(
                    bucket: bucket, from: start, to: end, aud: aud, types: type.map { EventType(apple: $0)?.rawValue ?? $0 })
            }
            if json {
                for row in rows { print(JSONValue.object(["start": .string(iso8601(row.start)), "type": .string(row.type), "count": .number(Double(row.count))]).jsonText) }
            } else if rows.isEmpty {
                print("no notifications between \(iso8601(start)) and \(iso8601(end))")
            } else {
                print(table(["\(bucket.uppercased()) START", "TYPE", "COUNT"], rows.map { [iso8601($0.start), $0.type, "\($0.count)"] }))
            }
        }
    }
}

struct RejectionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rejections", abstract: "Refused deliveries: why a notification didn't arrive.", subcommands: [List.self, Replay.self])

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List recorded rejections, newest first, with per-reason totals.",
            discussion: """
                Examples:
                  siwa-events rejections list
                  siwa-events rejections list --reason wrong_audience --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "Only this reason (e.g. wrong_audience, bad_signature, unknown_key).") var reason: String?
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            try ListFlags.checkReason(reason)
            try ListFlags.checkLimit(limit)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let (items, counts) = try await Database.with(database, logger: logger) { database in
                let store = RejectionStore(client: database.client, logger: logger)
                return (try await store.list(reason: reason, limit: limit), try await store.counts(since: Date().addingTimeInterval(-86_400)))
            }
            if json {
                for item in items {
                    var object: [String: JSONValue] = [
                        "id": .number(Double(item.id)), "received_at": .string(iso8601(item.receivedAt)), "reason": .string(item.reason),
                        "message": .string(item.message), "body_size": .number(Double(item.bodySize)), "token_kept": .bool(item.hasToken),
                    ]
                    object["remote_addr"] = item.remoteAddress.map(JSONValue.string) ?? .null
                    object["kid"] = item.kid.map(JSONValue.string) ?? .null
                    object["aud"] = item.aud.map(JSONValue.string) ?? .null
                    object["jti"] = item.jti.map(JSONValue.string) ?? .null
                    object["replayed_at"] = item.replayedAt.map { .string(iso8601($0)) } ?? .null
                    object["replay_outcome"] = item.replayOutcome.map(JSONValue.string) ?? .null
                    print(JSONValue.object(object).jsonText)
                }
                return
            }
            if items.isEmpty {
                print("no rejections recorded")
            } else {
                print(table(
                    ["RECEIVED", "REASON", "REMOTE", "AUD", "KID", "JTI", "REPLAY", "MESSAGE"],
                    items.map {
                        [iso8601($0.receivedAt), $0.reason, $0.remoteAddress ?? "-", $0.aud ?? "-", $0.kid ?? "-", $0.jti ?? "-",
                         $0.replayOutcome ?? ($0.hasToken ? "pending" : "-"), $0.message]
                    }))
            }
            if !counts.isEmpty {
                print("\nlast 24h: " + counts.map { "\($0.reason) \($0.recorded + $0.sampledOut) (\($0.sampledOut) not kept)" }.joined(separator: ", "))
            }
        }
    }

    struct Replay: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Re-check kept tokens with the current configuration and record those that now pass.",
            discussion: """
                Use after fixing SIWA_APPLE_BUNDLE_IDS: genuine notifications refused as wrong_audience are recorded as if they had been accepted when they arrived.

                Examples:
                  siwa-events rejections replay --bundle-ids com.example.app,com.example.fixed
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        @Option(help: "The reason to replay; only wrong_audience rejections keep their token.") var reason: String = "wrong_audience"

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: true)
            let logger = try makeLogger(settings)
            let summary = try await Database.with(database, logger: logger) { database in
                try await RejectionReplay(
                    notifications: NotificationStore(client: database.client, logger: logger),
                    rejections: RejectionStore(client: database.client, logger: logger),
                    verifier: NotificationVerifier(audiences: Set(apple.bundleIDs), clockSkew: apple.clockSkew)
                ).run(reason: reason) { done, total in printError("replayed \(done)/\(total)") }
            }
            let still = summary.stillRejected.sorted { $0.key < $1.key }.map { "\($0.value) still \($0.key)" }
            print("recorded \(summary.recorded), duplicates \(summary.duplicates)" + (still.isEmpty ? "" : ", " + still.joined(separator: ", ")))
        }
    }
}
