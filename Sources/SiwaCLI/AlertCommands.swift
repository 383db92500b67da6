import ArgumentParser
import Foundation
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaWorkers

struct AlertsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "alerts", abstract: "Alerts on revocation spikes and operational trouble: list, test the sinks, silence.",
        subcommands: [List.self, Evaluate.self, Test.self, Silence.self, Silences.self])

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List alerts, newest first.",
            discussion: """
                Examples:
                  siwa-events alerts list
                  siwa-events alerts list --state firing --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "firing or resolved (default: both).") var state: String?
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            if let state, !["firing", "resolved"].contains(state) { throw ValidationError("--state must be firing or resolved (got \"\(state)\")") }
            try ListFlags.checkLimit(limit)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let alerts = try await Database.with(database, logger: logger) { database in
                try await AlertStore(client: database.client, logger: logger).list(state: state, limit: limit)
            }
            if json {
                for alert in alerts { print(alert.json.jsonText) }
            } else if alerts.isEmpty {
                print(state == "firing" ? "no firing alerts" : "no alerts")
            } else {
                print(table(
                    ["ID", "STATE", "KIND", "AUD", "SERIES", "PEAK", "BASELINE", "RATIO", "STARTED", "RESOLVED", "SILENCED"],
                    alerts.map {
                        ["\($0.id)", $0.state, $0.episode.key.kind.rawValue, $0.episode.key.aud ?? "-",
                         $0.message.series.isEmpty ? "-" : $0.message.series.joined(separator: ","), "\($0.episode.peak)",
                         $0.episode.baseline.map { String(format: "%.1f", $0) } ?? "-", $0.episode.ratio.map { String(format: "%.1f", $0) } ?? "-",
                         iso8601($0.episode.startedAt), $0.resolvedAt.map(iso8601) ?? "-", $0.silencedBy == nil ? "-" : "yes"]
                    }))
            }
        }
    }

    struct Evaluate: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Evaluate every alert rule once, now, and say what fired, changed and resolved.",
            discussion: """
                What the evaluator of `serve` does every SIWA_SPIKE_INTERVAL, on demand: after loading
                history, or to see why something did or did not fire. It takes the alerts lease as
                the evaluator does (and gives it back), so it never evaluates beside another
                process; --dry-run takes no lease and writes nothing.
                Examples:
                  siwa-events alerts evaluate
                  siwa-events alerts evaluate --dry-run
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .alerts, .logging]
        @Flag(name: .customLong("dry-run"), help: "Show what would fire, change or resolve; write and tell nothing.") var dryRun = false

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            var watched = try AlertMonitor.Configuration(settings)
            watched.apps = try AppleSettings(settings, receiving: false).bundleIDs.sorted()
            let configuration = watched
            let logger = try makeLogger(settings)
            let identity = "\(cliActor):\(ProcessInfo.processInfo.processIdentifier)"
            let evaluated = try await Database.with(database, logger: logger) { database -> (AlertMonitor, [AlertDecision])? in
                // The counts the rules read, up to date (the workers fold them every few seconds).
                let history = HistoryStore(client: database.client, logger: logger)
                while try await history.foldCounts() == HistoryStore.foldLimit {}
                let monitor = AlertMonitor(
                    configuration: configuration, store: AlertStore(client: database.client, logger: logger), logger: logger, identity: identity)
                let leases = LeaseStore(client: database.client, logger: logger)
                if dryRun { return (monitor, try await monitor.preview(now: Date())) }
                let round: AlertMonitor.AlertRound
                do {
                    round = try await monitor.runOnce(now: Date())
                } catch {
                    try? await leases.release(lease: AlertMonitor.leaseName, holder: identity)
                    throw error
                }
                try await leases.release(lease: AlertMonitor.leaseName, holder: identity)
                guard case .evaluated(let decisions) = round else { return nil }
                return (monitor, decisions)
            }
            guard let (monitor, decisions) = evaluated else {
                print("another process holds the alerts lease and evaluates every SIWA_SPIKE_INTERVAL: nothing done (--dry-run shows what it would decide)")
                return
            }
            if decisions.isEmpty { print(dryRun ? "would change nothing" : "nothing fired, changed or resolved") }
            for decision in decisions {
                guard let episode = decision.episode else { continue }
                let what = switch decision {
                case .fire: "firing"
                case .join: "updated"
                case .update: "recorded"
                case .resolve: "resolved"
                case .none: "none"
                }
                var resolvedAt: Date?
                if case .resolve(_, let at) = decision { resolvedAt = at }
                let key = [episode.key.kind.rawValue, episode.key.aud, episode.key.type].compactMap { $0 }.joined(separator: " ")
                let message = AlertMessage(id: 0, episode: episode, window: configuration.rules.spike.window, resolvedAt: resolvedAt)
                print("\(dryRun ? "would be " : "")\(what) \(key): \(monitor.subject(message))")
            }
        }
    }

    struct Test: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send a test alert through every configured sink and wait for each outcome (a running worker process delivers it).",
            discussion: """
                Examples:
                  siwa-events alerts test
                """)
        static let settingGroups: [SettingGroup] = [.database, .alerts, .logging]
        @Option(help: "How long to wait for the deliveries, e.g. 30s.") var wait: String = "30s"

        func validate() throws {
            if (try? DurationSyntax.parse(wait)) == nil { throw ValidationError("--wait must be a duration like 30s (got \"\(wait)\")") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let alerts = try AlertMonitor.Configuration(settings)
            let sinks = alerts.sinks
            if sinks.isEmpty {
                printError("siwa-events: no alert sink is configured (SIWA_ALERT_WEBHOOK_URLS, SIWA_ALERT_SLACK_URL); alerts go to the log only")
                throw ExitCode(78)
            }
            let logger = try makeLogger(settings)
            let limit = try DurationSyntax.parse(wait)
            let failed = try await Database.with(database, logger: logger) { database -> Bool in
                let store = AlertStore(client: database.client, logger: logger)
                let id = try await store.test(window: alerts.rules.spike.window) { sinks.messages($0, subject: AlertMessage.testSubject) }
                printError("queued test alert \(id) for \(sinks.webhooks.count + (sinks.slack == nil ? 0 : 1)) sink(s); waiting up to \(wait)…")
                let deadline = ContinuousClock.now + limit
                var outcomes: [AlertDelivery] = []
                repeat {
                    outcomes = try await store.deliveries(alertID: id)
                    if outcomes.allSatisfy({ $0.state == .completed || $0.state == .discarded }) { break }
                    try await Task.sleep(for: .milliseconds(250))
                } while ContinuousClock.now < deadline
                for outcome in outcomes {
                    let result = switch outcome.state {
                    case .completed: "delivered (HTTP \(outcome.lastStatus.map(String.init) ?? "?"))"
                    case .discarded: "failed: \(outcome.lastError ?? "discarded")"
                    case .retryable: "retrying: \(outcome.lastError ?? "")"
                    default: "not delivered yet (is a worker running? `siwa-events serve` with SIWA_ROLE all or worker)"
                    }
                    print("\(outcome.target): \(result)")
                }
                return !outcomes.allSatisfy { $0.state == .completed }
            }
            if failed { throw ExitCode(1) }
        }
    }

    struct Silence: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Silence an alert kind (for one app or all) for a while: alerts are still recorded, sinks are not told.",
            discussion: """
                Examples:
                  siwa-events alerts silence --kind revocation_spike --for 2h
                  siwa-events alerts silence --kind queue_lag --for 30m --reason upgrade
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: ArgumentHelp("The alert kind: \(Self.kinds).")) var kind: String
        @Option(help: "Only this app (bundle ID); default every app.") var aud: String?
        /// The kinds of the rules `serve` evaluates.
        static let known = AlertMonitor.Configuration().registered.map(\.kind)
        static let kinds = known.map(\.rawValue).joined(separator: ", ")
        @Option(name: .customLong("for"), help: "How long, e.g. 2h.") var duration: String
        @Option(help: "Why (shown in `alerts silences`).") var reason: String?

        func validate() throws {
            guard let kind = AlertKind(rawValue: kind), Self.known.contains(kind) else {
                throw ValidationError("--kind must be one of \(Self.kinds) (got \"\(kind)\")")
            }
            guard let value = try? DurationSyntax.parse(duration), value > .zero, value <= .seconds(90 * 86_400) else {
                throw ValidationError("--for must be a duration between 1s and 90d, like 2h (got \"\(duration)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let silence = try await Database.with(database, logger: logger) { database in
                try await AlertSilenceStore(client: database.client, logger: logger).silence(
                    kind: AlertKind(rawValue: kind)!, aud: aud, for: try DurationSyntax.parse(duration), by: cliActor, reason: reason)
            }
            print("silenced \(kind)\(aud.map { " for \($0)" } ?? "") until \(iso8601(silence.until)) (silence \(silence.id))")
        }
    }

    struct Silences: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List silences still running (with --expired, also those ended in the last day).",
            discussion: """
                Examples:
                  siwa-events alerts silences
                  siwa-events alerts silences --expired
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Flag(help: "Include silences that ended in the last day.") var expired = false
        @Flag(help: "One JSON object per line.") var json = false

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let silences = try await Database.with(database, logger: logger) { database in
                try await AlertSilenceStore(client: database.client, logger: logger).silences(includeExpired: expired)
            }
            if json {
                for silence in silences { print(silence.json.jsonText) }
            } else if silences.isEmpty {
                print("no silences")
            } else {
                print(table(
                    ["ID", "KIND", "AUD", "UNTIL", "BY", "REASON"],
                    silences.map { ["\($0.id)", $0.kind.rawValue, $0.aud ?? "(all)", iso8601($0.until), $0.createdBy, $0.reason ?? "-"] }))
            }
        }
    }
}
