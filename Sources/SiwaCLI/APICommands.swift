import ArgumentParser
import Foundation
import SiwaApp
import SiwaDomain
import SiwaStore

/// Who runs a CLI command, for the audit log.
var cliActor: String {
    "cli:\(ProcessInfo.processInfo.environment["SUDO_USER"] ?? ProcessInfo.processInfo.environment["USER"] ?? ProcessInfo.processInfo.userName)"
}

struct TokensCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokens", abstract: "Bearer tokens for the backend API (stored as hashes only).", subcommands: [Create.self, List.self, Revoke.self])

    struct Create: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a token; prints it once, on stdout.",
            discussion: """
                Examples:
                  siwa-events tokens create --name backend --scope sessions:write
                  siwa-events tokens create --name ops --scope admin --expires 90d --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "A name for it (letters, digits, . _ -), unique among live tokens.") var name: String
        @Option(name: .customLong("scope"), help: "A scope it grants (repeat for several): \(APIScope.valueNames).") var scopes: [String] = []
        @Option(help: "Lifetime, e.g. 90d (default: until revoked).") var expires: String?
        @Flag(help: "Print {\"id\",\"name\",\"token\",\"scopes\",\"expires_at\"} instead of the bare token.") var json = false

        func validate() throws {
            if scopes.isEmpty { throw ValidationError("give at least one --scope: \(APIScope.valueNames)") }
            if let unknown = scopes.first(where: { APIScope(rawValue: $0) == nil }) {
                throw ValidationError("--scope \(unknown) is not a scope; scopes: \(APIScope.valueNames)")
            }
            if name.range(of: "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", options: .regularExpression) == nil {
                throw ValidationError("--name must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (got \"\(name)\")")
            }
            if let expires, (try? DurationSyntax.parse(expires)) == nil {
                throw ValidationError("--expires must be a duration like 90d or 12h (got \"\(expires)\")")
            }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let scopes = self.scopes.compactMap(APIScope.init(rawValue:))
            let expiresAt = try expires.map { Date().addingTimeInterval(try DurationSyntax.parse($0).timeInterval) }
            let created: (id: String, token: String)
            do {
                created = try await Database.with(database, logger: logger) { database in
                    try await TokenStore(client: database.client, logger: logger).create(name: name, scopes: scopes, expiresAt: expiresAt, actor: cliActor)
                }
            } catch let error as TokenStoreError {
                printError("siwa-events: \(error.description)")
                throw ExitCode(1)
            }
            if json {
                print(JSONValue.object([
                    "id": .string(created.id), "name": .string(name), "token": .string(created.token),
                    "scopes": .array(scopes.map { .string($0.rawValue) }), "expires_at": expiresAt.map { .string(iso8601($0)) } ?? .null,
                ]).jsonText)
            } else {
                print(created.token)
            }
            printError("token \(name) created (id \(created.id)); it is shown only now")
        }
    }

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List tokens (never the tokens themselves).",
            discussion: """
                Examples:
                  siwa-events tokens list
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Flag(help: "Include revoked tokens.") var all = false
        @Flag(help: "One JSON object per line.") var json = false

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let tokens = try await Database.with(database, logger: logger) { database in
                try await TokenStore(client: database.client, logger: logger).list(includeRevoked: all)
            }
            func time(_ date: Date?) -> JSONValue { date.map { .string(iso8601($0)) } ?? .null }
            if json {
                for token in tokens {
                    print(JSONValue.object([
                        "id": .string(token.id), "name": .string(token.name), "scopes": .array(token.scopes.map(JSONValue.string)),
                        "created_at": time(token.createdAt), "expires_at": time(token.expiresAt), "last_used_at": time(token.lastUsedAt),
                        "revoked_at": time(token.revokedAt),
                    ]).jsonText)
                }
            } else if tokens.isEmpty {
                print("no tokens; create one with `siwa-events tokens create --name N --scope S`")
            } else {
                print(table(
                    ["NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "REVOKED", "ID"],
                    tokens.map {
                        [$0.name, $0.scopes.joined(separator: ","), iso8601($0.createdAt), $0.expiresAt.map(iso8601) ?? "never",
                         $0.lastUsedAt.map(iso8601) ?? "never", $0.revokedAt.map(iso8601) ?? "-", $0.id]
                    }))
            }
        }
    }

    struct Revoke: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Revoke a token by name or id: it answers 401 from now on.",
            discussion: """
                Examples:
                  siwa-events tokens revoke backend
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Argument(help: "The token's name or id.") var token: String

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let revoked = try await Database.with(database, logger: logger) { database in
                try await TokenStore(client: database.client, logger: logger).revoke(token, actor: cliActor)
            }
            guard let revoked else {
                printError("siwa-events: no live token named or with id \(token) (see `siwa-events tokens list`)")
                throw ExitCode(1)
            }
            print("revoked token \(revoked)")
        }
    }
}

struct AuditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit", abstract: "The audit log: token creation and revocation, privacy erasures.", subcommands: [List.self])

    struct List: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List audit entries, newest first.",
            discussion: """
                Examples:
                  siwa-events audit list --limit 20
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws { try ListFlags.checkLimit(limit) }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let entries = try await Database.with(database, logger: logger) { database in
                try await TokenStore(client: database.client, logger: logger).audit(limit: limit)
            }
            if json {
                for entry in entries {
                    print(JSONValue.object([
                        "id": .number(Double(entry.id)), "at": .string(iso8601(entry.at)), "actor": .string(entry.actor), "action": .string(entry.action),
                        "target": .string(entry.target), "details": JSONValue.parse(Data(entry.details.utf8)) ?? .null,
                    ]).jsonText)
                }
            } else if entries.isEmpty {
                print("no audit entries")
            } else {
                print(table(["AT", "ACTOR", "ACTION", "TARGET", "DETAILS"], entries.map { [iso8601($0.at), $0.actor, $0.action, $0.target, $0.details] }))
            }
        }
    }
}

struct AccountsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "accounts", abstract: "Sign in with Apple users' accounts.", subcommands: [Erase.self])

    struct Erase: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete an account: erase the user's email everywhere, revoke their sessions and Apple tokens (audited).",
            discussion: """
                Examples:
                  siwa-events accounts erase --aud com.example.app --sub 001234.abcd
                """)
        static let settingGroups: [SettingGroup] = [.database, .suppressions, .logging]
        @Option(help: "The app's bundle ID.") var aud: String
        @Option(help: "Apple's user identifier.") var sub: String

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let suppressions = SuppressionOptions(targets: try settings.value(Settings.suppressionTargets))
            let erasure = try await Database.with(database, logger: logger) { database in
                try await AccountStore(client: database.client, logger: logger, suppressions: suppressions).erase(aud: aud, sub: sub, actor: cliActor)
            }
            print(
                "erased \(aud)/\(sub) at \(iso8601(erasure.erasedAt)); revoked \(erasure.revokedSessions) session\(erasure.revokedSessions == 1 ? "" : "s");"
                    + " queued \(erasure.appleRevocations) Apple token revocation\(erasure.appleRevocations == 1 ? "" : "s")")
        }
    }
}

struct DatabaseCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db", abstract: "Database administration.", subcommands: [GrantBackend.self])

    struct GrantBackend: SettingsCommand {
        static let configuration = CommandConfiguration(
            commandName: "grant-backend",
            abstract: "Grant an existing role exactly what docs/integration.md's session SQL needs (sessions, accounts), nothing else.",
            discussion: """
                Examples:
                  siwa-events db grant-backend --role backend_app
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Option(help: "The PostgreSQL role your backend connects as (must exist).") var role: String

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            do {
                let outcome = try await Database.with(database, logger: logger) { database in
                    try await BackendGrants(client: database.client, logger: logger).grant(role: role)
                }
                for statement in outcome.statements { print(statement + ";") }
                // Valid SQL as a whole: what PUBLIC keeps is said in comments, with its revocation.
                if outcome.publicPrivileges.isEmpty {
                    print("-- PUBLIC holds neither TEMPORARY on this database nor CREATE on schema public: \(role) can create no objects of its own.")
                } else {
                    print("-- PUBLIC, and so \(role), still holds what lets a role create objects of its own; the session trigger")
                    print("-- resolves no name through them (sql/015), but a database owner can take them away:")
                    for held in outcome.publicPrivileges { print("--   \(held.revoke);   (\(held.privilege))") }
                }
            } catch let error as BackendGrantsError {
                printError("siwa-events: \(error.description)")
                throw ExitCode(1)
            }
        }
    }
}
