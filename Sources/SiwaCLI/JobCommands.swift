import ArgumentParser
import Foundation
import Logging
import SiwaApp
import SiwaDomain
import SiwaStore

struct JobsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "jobs", abstract: "The job queue: inspect and retry the jobs of any lane (effects unless --lane).",
        subcommands: [List.self, Retry.self])

    /// `--lane`: a declared lane's name, or a message naming the lanes.
    static func lane(_ name: String?) throws -> Lane {
        guard let name else { return .effects }
        guard let lane = Lane(rawValue: name) else {
            throw ValidationError("--lane must be one of \(Lane.all.map(\.rawValue).joined(separator: ", ")) (got \"\(name)\")")
        }
        return lane
    }

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List jobs, newest first.",
            discussion: """
                Examples:
                  siwa-events jobs list
                  siwa-events jobs list --state discarded --json
                  siwa-events jobs list --lane callbacks --state retryable
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "The lane: effects (default), callbacks, alerts, apple_revocations.") var lane: String?
        @Option(help: "Only this state: available, running, retryable, completed, discarded.") var state: String?
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            let states = JobState.allCases.map(\.rawValue)
            if let state, JobState(rawValue: state) == nil {
                throw ValidationError("--state must be one of \(states.joined(separator: ", ")) (got \"\(state)\")")
            }
            try ListFlags.checkLimit(limit)
            _ = try JobsCommand.lane(lane)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let lane = try JobsCommand.lane(lane)
            guard lane == .effects else { return try await listLane(lane, database: database, logger: logger) }
            let jobs = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).listEffects(state: state.flatMap(JobState.init(rawValue:)), limit: limit)
            }
            if json {
                for job in jobs {
                    print(JSONValue.object([
                        "id": .number(Double(job.id)), "state": .string(job.state.rawValue), "attempt": .number(Double(job.attempt)), "jti": .string(job.jti),
                        "aud": .string(job.aud), "sub": job.sub.map(JSONValue.string) ?? .null, "type": job.type.map(JSONValue.string) ?? .null,
                        "run_at": .string(iso8601(job.runAt)), "created_at": .string(iso8601(job.createdAt)),
                        "finished_at": job.finishedAt.map { .string(iso8601($0)) } ?? .null,
                        "locked_by": job.lockedBy.map(JSONValue.string) ?? .null, "last_error": job.lastError.map(JSONValue.string) ?? .null,
                    ]).jsonText)
                }
            } else if jobs.isEmpty {
                print("no jobs match")
            } else {
                print(table(
                    ["ID", "STATE", "ATTEMPT", "TYPE", "SUB", "RUN AT", "JTI", "LAST ERROR"],
                    jobs.map { ["\($0.id)", $0.state.rawValue, "\($0.attempt)", $0.type ?? "-", $0.sub ?? "-", iso8601($0.runAt), $0.jti, $0.lastError ?? "-"] }))
            }
        }

        /// Any other lane: its jobs as every lane shows them (never a payload).
        func listLane(_ lane: Lane, database: DatabaseSettings, logger: Logger) async throws {
            let jobs = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).list(lane: lane, state: state.flatMap(JobState.init(rawValue:)), limit: limit)
            }
            if json {
                for job in jobs { print(job.json.jsonText) }
            } else if jobs.isEmpty {
                print("no jobs match")
            } else {
                print(table(
                    ["ID", "STATE", "ATTEMPT", "KIND", "SUBJECT", "TARGET", "RUN AT", "LAST ERROR"],
                    jobs.map { job in
                        let subject = job.notificationID.map { "notification \($0)" } ?? job.alertID.map { "alert \($0)" } ?? job.sub ?? "-"
                        return ["\(job.id)", job.state.rawValue, "\(job.attempt)", job.kind, subject, job.target ?? "-", iso8601(job.runAt), job.lastError ?? "-"]
                    }))
            }
        }
    }

    struct Retry: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Put a job, or every discarded job, back in the queue.",
            discussion: """
                Examples:
                  siwa-events jobs retry 42
                  siwa-events jobs retry --discarded --type account-delete
                  siwa-events jobs retry --lane apple_revocations --discarded
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "The lane: effects (default), callbacks, alerts, apple_revocations.") var lane: String?
        @Argument(help: "The job id (see `jobs list`).") var id: Int?
        @Flag(help: "Retry every discarded job.") var discarded = false
        @Option(help: "With --discarded: only jobs of this event type.") var type: String?

        func validate() throws {
            if (id == nil) == !discarded {
                throw ValidationError("give a job id, or --discarded (not both)")
            }
            if type != nil && !discarded { throw ValidationError("--type goes with --discarded") }
            let lane = try JobsCommand.lane(lane)
            if type != nil && lane != .effects { throw ValidationError("--type goes with the effects lane") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let lane = try JobsCommand.lane(lane)
            let count = try await Database.with(database, logger: logger) { database in
                let queue = JobQueue(client: database.client, logger: logger)
                return type == nil
                    ? try await queue.retry(lane: lane, id: id, discarded: discarded)
                    : try await queue.retryEffects(jobID: id, discarded: discarded, type: type.map { EventType(apple: $0)?.rawValue ?? $0 })
            }
            if count == 0, let id {
                printError("siwa-events: no job \(id) to retry (unknown, or running right now)")
                throw ExitCode(1)
            }
            print("queued \(count) job\(count == 1 ? "" : "s") again")
        }
    }
}

struct ReplayCommand: SettingsCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay", abstract: "Re-run a stored notification's effect (idempotent).",
        discussion: """
            Examples:
              siwa-events replay 5f8c1f0e-jti-from-the-list
            """)
    static let settingGroups: [SettingGroup] = [.database, .logging]
    @Argument(help: "The notification's jti.") var jti: String

    func run(_ settings: SettingSource) async throws {
        let database = try DatabaseSettings(settings)
        let logger = try makeLogger(settings)
        let replayed = try await Database.with(database, logger: logger) { database in
            try await JobQueue(client: database.client, logger: logger).replayEffect(jti: jti)
        }
        guard replayed else {
            printError("siwa-events: no notification \(jti) with an effect to replay (unknown jti, skipped notification, or its job is running)")
            throw ExitCode(1)
        }
        print("queued the effect of \(jti) again; a worker applies it")
    }
}
