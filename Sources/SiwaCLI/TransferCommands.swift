import ArgumentParser
import Foundation
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaStore

/// App transfers between developer teams (Apple's TN3159): the sending side's identifiers.
struct TransfersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transfers", abstract: "Move an app's users to another developer team without losing one.",
        subcommands: [Start.self, Prepare.self, Export.self, Import.self, Exchange.self, Status.self])

    /// `--client-id`, defaulting to the one configured bundle ID; the bundle ID it signs in to.
    struct ClientChoice: ParsableArguments {
        @Option(name: .customLong("client-id"), help: "The transferred app's client ID (default: the one SIWA_APPLE_BUNDLE_IDS names).")
        var clientID: String?

        func resolve(_ apple: AppleSettings) throws -> (clientID: String, aud: String) {
            if let clientID {
                guard let aud = apple.clientIDs[clientID] else {
                    throw ValidationError("--client-id \(clientID) is not configured: choose one of \(apple.clientIDs.keys.sorted().joined(separator: ", "))")
                }
                return (clientID, aud)
            }
            guard apple.bundleIDs.count == 1, let only = apple.bundleIDs.first else {
                throw ValidationError("--client-id is required: SIWA_APPLE_BUNDLE_IDS names \(apple.bundleIDs.count) apps (\(apple.bundleIDs.sorted().joined(separator: ", ")))")
            }
            return (only, only)
        }
    }

    /// `--rate` and `--concurrency`: how fast `prepare` and `exchange` call Apple.
    struct Pacing: ParsableArguments {
        @Option(help: "Calls to Apple per second at most.") var rate: Double = 10
        @Option(help: "Calls to Apple in flight at once (against Apple's round trip; --rate still holds).") var concurrency: Int = 1

        func validate() throws {
            guard rate > 0, rate <= 1000 else { throw ValidationError("--rate must be between 0 and 1000 calls a second (got \(rate))") }
            guard (1...64).contains(concurrency) else { throw ValidationError("--concurrency must be between 1 and 64 calls (got \(concurrency))") }
        }
    }

    struct Start: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Record an app transfer and its date: Apple's 60-day window starts there.",
            discussion: """
                The sending team names the recipient (--target), the receiving team the sender (--from).
                Examples:
                  siwa-events transfers start --target ABCDE12345 --date 2026-11-20
                  siwa-events transfers start --from FGHIJ67890 --date 2026-11-20
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        @Option(help: "Sending side: the recipient team's ID.") var target: String?
        @Option(help: "Receiving side: the sending team's ID.") var from: String?
        @Option(help: "The day Apple completed the transfer (YYYY-MM-DD, UTC).") var date: String
        @OptionGroup var client: ClientChoice

        func validate() throws {
            guard (target == nil) != (from == nil) else { throw ValidationError("give --target (sending side) or --from (receiving side), not both") }
            let team = target ?? from ?? ""
            guard ClientSecretPolicy.isAppleIdentifier(team) else {
                throw ValidationError("\(target == nil ? "--from" : "--target") must be a team ID: 10 characters, A-Z and 0-9 (got \"\(team)\")")
            }
            guard Self.day(date) != nil else { throw ValidationError("--date must be a day like 2026-11-20 (got \"\(date)\")") }
        }

        static func day(_ text: String) -> Date? {
            guard text.count == 10 else { return nil }
            return try? Date(text + "T00:00:00Z", strategy: .iso8601)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: false)
            let (clientID, aud) = try client.resolve(apple)
            let logger = try makeLogger(settings)
            let transferredAt = Self.day(date)!
            // The sending side lists the app's users now, so its users left (and the deadline
            // alert) count them before the first `prepare`.
            let transfer = try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                let transfer = try await store.start(
                    target == nil ? .incoming : .outgoing, clientID: clientID, aud: aud, teamID: target ?? from ?? "", transferredAt: transferredAt,
                    actor: cliActor)
                if transfer.direction == .outgoing { try await store.listUsers(of: transfer) }
                return transfer
            }
            let window = TransferWindow(transferredAt: transfer.transferredAt)
            print("\(transfer.direction.rawValue) transfer of \(clientID) \(target == nil ? "from" : "to") team \(transfer.teamID) on \(date): " + Self.describe(window, at: Date()))
        }

        /// "N days left (until …)" or that the window has closed.
        static func describe(_ window: TransferWindow, at now: Date) -> String {
            let closes = iso8601(window.closesAt)
            return window.isOpen(at: now)
                ? "\(window.daysLeft(at: now)) days left to exchange identifiers (until \(closes))"
                : "the 60-day window closed at \(closes): Apple no longer exchanges identifiers for it"
        }
    }

    struct Prepare: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sending side: ask Apple for every known user's transfer_sub for the recipient team (resumable).",
            discussion: """
                Each known user of the app gets the identifier the recipient team exchanges for its own sub.
                Stop it any time: a rerun asks only for the rest. A user Apple refuses (e.g. who revoked the
                app) is kept with the error and skipped; --retry-failed asks again.
                Examples:
                  siwa-events transfers prepare --target ABCDE12345
                  siwa-events transfers prepare --target ABCDE12345 --rate 20 --retry-failed
                  siwa-events transfers prepare --target ABCDE12345 --rate 100 --concurrency 8
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .appleCredentials, .logging]
        @Option(help: "The recipient team's ID (10 characters, A-Z and 0-9).") var target: String
        @OptionGroup var client: ClientChoice
        @OptionGroup var pacing: Pacing
        @Flag(name: .customLong("retry-failed"), help: "Ask again for the users Apple refused before.") var retryFailed = false

        func validate() throws {
            guard ClientSecretPolicy.isAppleIdentifier(target) else {
                throw ValidationError("--target must be the recipient's team ID: 10 characters, A-Z and 0-9 (got \"\(target)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: false)
            let (clientID, aud) = try client.resolve(apple)
            guard let credentials = try AppleCredentials.configured(settings) else {
                throw ConfigurationError(
                    variable: Settings.appleTeamID.info.name,
                    message: "is required: transfer identifiers are asked for with the team's credentials (SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID, SIWA_APPLE_PRIVATE_KEY_FILE)")
            }
            guard target != credentials.policy.teamID else {
                throw ValidationError("--target \(target) is this team (SIWA_APPLE_TEAM_ID): give the recipient team's ID")
            }
            let logger = try makeLogger(settings)
            let appleClient = credentials.client()
            try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                let transfer = try await store.start(.outgoing, clientID: clientID, aud: aud, teamID: target, transferredAt: nil, actor: cliActor)
                let added = try await store.listUsers(of: transfer)
                if retryFailed { try await store.retryFailed(of: transfer) }
                let gateway = AppleGateway(
                    client: appleClient, recorder: AppleTokenStore(client: database.client, logger: logger), pacer: ApplePacer(perSecond: pacing.rate))
                let source = AppleMigrationCalls(gateway: gateway, clientID: clientID, target: target)
                let preparation = TransferPreparation(store: store, transfer: transfer, source: source)
                var progress = try await store.progress(of: transfer)
                printError("transfer of \(clientID) to team \(target): \(progress.total) users (\(added) new), \(progress.pending) to ask for")
                let stopped = try await TransfersCommand.drive(pending: progress.pending) { limit in
                    try await preparation.runOnce(limit: limit, concurrency: pacing.concurrency)
                }
                progress = try await store.progress(of: transfer)
                print("\(progress.computed) of \(progress.total) users have a transfer_sub for team \(target)")
                for (word, count) in progress.failed.sorted(by: { $0.key < $1.key }) {
                    print("\(count) refused by Apple: \(printable(word)) (kept; `transfers prepare --target \(target) --retry-failed` asks again)")
                }
                if let stopped {
                    printError("siwa-events: stopped with \(progress.pending) users left: \(printable(stopped.description, limit: 1024))")
                    throw ExitCode(1)
                }
            }
        }
    }

    struct Export: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sending side: write the transfer_subs the recipient team needs (0600; no sub, no address).",
            discussion: """
                One JSON object per line, {"transfer_sub": "…"}, after a first line naming the app and the team.
                Examples:
                  siwa-events transfers export --target ABCDE12345 --output transfer.ndjson
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        @Option(help: "The recipient team's ID.") var target: String
        @OptionGroup var client: ClientChoice
        @Option(help: "The file to write (replaced whole; readable by its owner only).") var output: String

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: false)
            let (clientID, _) = try client.resolve(apple)
            let logger = try makeLogger(settings)
            let (transfer, subs) = try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                guard let transfer = try await store.list().first(where: { $0.direction == .outgoing && $0.clientID == clientID && $0.teamID == target })
                else { throw ValidationError("no transfer of \(clientID) to team \(target): run `transfers prepare --target \(target)` first") }
                return (transfer, try await store.transferSubs(of: transfer))
            }
            let file: PrivateFile
            do {
                file = try PrivateFile(creating: output)
            } catch {
                printError("siwa-events: --output: \(error)")
                throw ExitCode(1)
            }
            do {
                let header: JSONValue = [
                    "client_id": .string(transfer.clientID), "target": .string(transfer.teamID), "count": .number(Double(subs.count)),
                ]
                var text = header.jsonText + "\n"
                for value in subs { text += JSONValue.object(["transfer_sub": .string(value)]).jsonText + "\n" }
                file.handle.write(Data(text.utf8))
                try file.commit()
            } catch {
                file.discard()
                throw error
            }
            print("wrote \(subs.count) transfer_subs for team \(target) to \(output)")
        }
    }

    struct Import: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Receiving side: take the sending team's export (transfer_subs) to exchange.",
            discussion: """
                Examples:
                  siwa-events transfers import transfer.ndjson --from FGHIJ67890
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .logging]
        @Argument(help: "The file `transfers export` wrote on the sending side.") var file: String
        @Option(help: "The sending team's ID.") var from: String
        @OptionGroup var client: ClientChoice

        static let maximumFileSize = 64 * 1024 * 1024

        func validate() throws {
            guard ClientSecretPolicy.isAppleIdentifier(from) else {
                throw ValidationError("--from must be the sending team's ID: 10 characters, A-Z and 0-9 (got \"\(from)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: false)
            let (clientID, aud) = try client.resolve(apple)
            let lines = try Self.read(file, clientID: clientID)
            let logger = try makeLogger(settings)
            let (transfer, added) = try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                let transfer = try await store.start(.incoming, clientID: clientID, aud: aud, teamID: from, transferredAt: nil, actor: cliActor)
                return (transfer, try await store.importTransferSubs(lines, into: transfer))
            }
            print("imported \(lines.count) transfer_subs from team \(transfer.teamID) (\(added) new); `transfers exchange --from \(from)` exchanges them")
        }

        /// The export's transfer_subs, after its header; errors name the line.
        static func read(_ path: String, clientID: String) throws -> [String] {
            let shownPath = printable(path, limit: 1024)
            guard let handle = FileHandle(forReadingAtPath: path) else { throw ValidationError("cannot read \(shownPath)") }
            defer { try? handle.close() }
            let data = (try? handle.read(upToCount: maximumFileSize + 1)) ?? Data()
            guard data.count <= maximumFileSize else { throw ValidationError("\(shownPath) is larger than \(maximumFileSize) bytes: not an export") }
            let lines = String(decoding: data, as: UTF8.self).split(separator: "\n")
            guard let header = lines.first.flatMap({ JSONValue.parse(Data($0.utf8)) }), let exported = header["client_id"]?.stringValue else {
                throw ValidationError("\(shownPath) does not start with the header `transfers export` writes")
            }
            guard exported == clientID else {
                throw ValidationError("\(shownPath) is for client ID \(printable(exported)), not \(clientID): pass --client-id \(printable(exported))")
            }
            var values: [String] = []
            for (index, line) in lines.dropFirst().enumerated() {
                guard let value = JSONValue.parse(Data(line.utf8))?["transfer_sub"]?.stringValue, (1...512).contains(value.utf8.count) else {
                    throw ValidationError("\(shownPath) line \(index + 2) is not {\"transfer_sub\": \"…\"}")
                }
                values.append(value)
            }
            return values
        }
    }

    struct Exchange: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Receiving side: exchange each transfer_sub for the user's sub in this team, re-keying their account.",
            discussion: """
                When this database moved with the app, the sender's prepared identifiers are exchanged and
                each account moves to its new sub (sessions, history, queued jobs; the old sub kept).
                Resumable and idempotent.
                Examples:
                  siwa-events transfers exchange --from FGHIJ67890
                  siwa-events transfers exchange --from FGHIJ67890 --rate 100 --concurrency 8
                """)
        static let settingGroups: [SettingGroup] = [.database, .apple, .appleCredentials, .logging]
        @Option(help: "The sending team's ID.") var from: String
        @OptionGroup var client: ClientChoice
        @OptionGroup var pacing: Pacing
        @Flag(name: .customLong("retry-failed"), help: "Ask again for the transfer_subs Apple refused before.") var retryFailed = false

        func validate() throws {
            guard ClientSecretPolicy.isAppleIdentifier(from) else {
                throw ValidationError("--from must be the sending team's ID: 10 characters, A-Z and 0-9 (got \"\(from)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let apple = try AppleSettings(settings, receiving: false)
            let (clientID, aud) = try client.resolve(apple)
            guard let credentials = try AppleCredentials.configured(settings) else {
                throw ConfigurationError(
                    variable: Settings.appleTeamID.info.name,
                    message: "is required: transfer_subs are exchanged with the receiving team's credentials (SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID, SIWA_APPLE_PRIVATE_KEY_FILE)")
            }
            let logger = try makeLogger(settings)
            let appleClient = credentials.client()
            try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                let transfer = try await store.start(
                    .incoming, clientID: clientID, aud: aud, teamID: from, transferredAt: nil, actor: cliActor, ourTeam: credentials.policy.teamID)
                try await store.importPrepared(into: transfer, ourTeam: credentials.policy.teamID)
                if retryFailed { try await store.retryRefusedImports(of: transfer) }
                let exchange = TransferExchange(
                    store: store, transfer: transfer,
                    source: AppleMigrationCalls(
                        gateway: AppleGateway(
                            client: appleClient, recorder: AppleTokenStore(client: database.client, logger: logger),
                            pacer: ApplePacer(perSecond: pacing.rate)),
                        clientID: clientID, target: nil))
                let pending = try await store.importProgress(of: transfer).pending
                if pending == 0 {
                    printError("nothing left to exchange: each transfer_sub is exchanged or refused (--retry-failed asks Apple again for the refused)")
                }
                let stopped = try await TransfersCommand.drive(pending: pending) { limit in
                    try await exchange.runOnce(limit: limit, concurrency: pacing.concurrency)
                }
                let progress = try await store.importProgress(of: transfer)
                print("\(progress.exchanged) of \(progress.total) transfer_subs exchanged (\(progress.rekeyed) \(progress.rekeyed == 1 ? "account" : "accounts") re-keyed)")
                for (word, count) in progress.failed.sorted(by: { $0.key < $1.key }) {
                    print("\(count) refused by Apple: \(printable(word)) (kept; `transfers exchange --from \(from) --retry-failed` asks again)")
                }
                if let stopped {
                    printError("siwa-events: stopped with \(progress.pending) transfer_subs left: \(printable(stopped.description, limit: 1024))")
                    throw ExitCode(1)
                }
            }
        }
    }

    struct Status: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Each recorded transfer: its users, identifiers and errors.",
            discussion: """
                Examples:
                  siwa-events transfers status
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            try await Database.with(database, logger: logger) { database in
                let store = TransferStore(client: database.client, logger: logger)
                let transfers = try await store.list()
                if transfers.isEmpty { print("no transfers") }
                for transfer in transfers where transfer.direction == .incoming {
                    let progress = try await store.importProgress(of: transfer)
                    let failed = progress.failed.sorted(by: { $0.key < $1.key }).map { "\($0.value) \(printable($0.key))" }.joined(separator: ", ")
                    print(
                        "incoming \(printable(transfer.clientID)) from team \(printable(transfer.teamID)): \(progress.exchanged)/\(progress.total) exchanged, \(progress.rekeyed) re-keyed"
                            + (failed.isEmpty ? "" : ", refused: \(failed)") + ", \(progress.pending) pending; "
                            + Start.describe(TransferWindow(transferredAt: transfer.transferredAt), at: Date()))
                }
                for transfer in transfers where transfer.direction == .outgoing {
                    let progress = try await store.progress(of: transfer)
                    let failed = progress.failed.sorted(by: { $0.key < $1.key }).map { "\($0.value) \(printable($0.key))" }.joined(separator: ", ")
                    print(
                        "\(transfer.direction.rawValue) \(printable(transfer.clientID)) team \(printable(transfer.teamID)): \(progress.computed)/\(progress.total) transfer_subs"
                            + (failed.isEmpty ? "" : ", refused: \(failed)") + ", \(progress.pending) pending; "
                            + Start.describe(TransferWindow(transferredAt: transfer.transferredAt), at: Date()))
                }
            }
        }
    }
}
