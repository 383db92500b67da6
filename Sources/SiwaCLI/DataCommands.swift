import ArgumentParser
import Foundation
import SiwaApp
import SiwaDomain
import SiwaStore

struct NotificationsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notifications", abstract: "Query recorded notifications.", subcommands: [List.self])

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List notifications, newest first.")
        @OptionGroup var options: ConfigOptions
        @Option(help: "Only this user (Apple's team-scoped sub).") var sub: String?
        @Option(help: "Only this bundle ID.") var aud: String?
        @Option(help: "Only this type: email-disabled, email-enabled, consent-revoked, account-delete.") var type: String?
        @Option(help: "Only this status: pending, applied, skipped, retrying, discarded.") var status: String?
        @Option(help: "At most this many (1-10000).") var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            if let status, ProcessingStatus(rawValue: status) == nil {
                throw ValidationError("--status must be one of \(ProcessingStatus.allCases.map(\.rawValue).joined(separator: ", ")) (got \"\(status)\")")
            }
            guard (1...10_000).contains(limit) else { throw ValidationError("--limit must be between 1 and 10000 (got \(limit))") }
        }

        func run() async throws {
            let config = try options.load(requireBundleIDs: false)
            let logger = makeLogger()
            let filter = NotificationFilter(sub: sub, aud: aud, type: type, status: status.flatMap(ProcessingStatus.init), limit: limit)
            let items = try await Database.with(config, logger: logger) { database in
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

struct RejectionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rejections", abstract: "Refused deliveries: why a notification didn't arrive.", subcommands: [List.self, Replay.self])

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List recorded rejections, newest first, with per-reason totals.")
        @OptionGroup var options: ConfigOptions
        @Option(help: "Only this reason (e.g. wrong_audience, bad_signature, unknown_key).") var reason: String?
        @Option(help: "At most this many (1-10000).") var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func run() async throws {
            let config = try options.load(requireBundleIDs: false)
            let logger = makeLogger()
            let (items, counts) = try await Database.with(config, logger: logger) { database in
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

    struct Replay: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Re-check kept tokens with the current configuration and record those that now pass.",
            discussion: "Use after fixing SIWA_APPLE_BUNDLE_IDS: genuine notifications refused as wrong_audience are recorded as if they had been accepted when they arrived.")
        @OptionGroup var options: ConfigOptions
        @Option(help: "The reason to replay; only wrong_audience rejections keep their token.") var reason: String = "wrong_audience"

        func run() async throws {
            let config = try options.load(requireBundleIDs: true)
            let logger = makeLogger()
            let summary = try await Database.with(config, logger: logger) { database in
                try await RejectionReplay(
                    notifications: NotificationStore(client: database.client, logger: logger),
                    rejections: RejectionStore(client: database.client, logger: logger),
                    verifier: NotificationVerifier(audiences: Set(config.bundleIDs), clockSkew: config.clockSkew)
                ).run(reason: reason) { done, total in printError("replayed \(done)/\(total)") }
            }
            let still = summary.stillRejected.sorted { $0.key < $1.key }.map { "\($0.value) still \($0.key)" }
            print("recorded \(summary.recorded), duplicates \(summary.duplicates)" + (still.isEmpty ? "" : ", " + still.joined(separator: ", ")))
        }
    }
}
