import ArgumentParser
import Foundation
import SiwaApp
import SiwaDomain
import SiwaStore

/// Custody of Apple's tokens: the keyring's keys, re-encryption, the revocation lane and the
/// record of every call made to Apple's auth endpoints.
struct AppleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple", abstract: "Apple's tokens kept from sign-ins: keys, re-encryption, revocations, calls.",
        subcommands: [TokenKey.self, Reencrypt.self, Revocations.self, Retry.self, Calls.self])

    struct TokenKey: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "token-key",
            abstract: "Print a new key for SIWA_APPLE_TOKEN_KEYS (base64 of 32 random bytes), or write it to a 0600 file.",
            discussion: """
                To rotate: put the new key first ("NEW OLD"), restart, run `siwa-events apple reencrypt`, then drop OLD.
                Examples:
                  SIWA_APPLE_TOKEN_KEYS=$(siwa-events apple token-key)
                  siwa-events apple token-key --output siwa-keys/token-key
                """)

        @Option(help: "Write the key to this file (mode 0600, replaced whole) instead of stdout.") var output: String?

        func run() throws {
            let key = AppleTokenCipher.generateKey()
            guard let output else {
                print(key)
                return
            }
            do {
                try PrivateFile.write(Data((key + "\n").utf8), to: output)
                printError("wrote a new key to \(output) (readable by you alone); give it to SIWA_APPLE_TOKEN_KEYS_FILE")
            } catch {
                printError("siwa-events: --output: \(error)")
                throw ExitCode(1)
            }
        }
    }

    struct Reencrypt: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Re-encrypt every kept token under the first key of SIWA_APPLE_TOKEN_KEYS, while serving.",
            discussion: """
                Each kept token and pending revocation under another key is decrypted and written back under the
                first key, unless it changed meanwhile (a new sign-in wins). When it finishes, the keys it names as
                unused can be dropped from SIWA_APPLE_TOKEN_KEYS. Audited.
                Examples:
                  SIWA_APPLE_TOKEN_KEYS="NEW OLD" siwa-events apple reencrypt
                """)
        static let settingGroups: [SettingGroup] = [.database, .appleCredentials, .logging]

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            guard let cipher = try settings.value(Settings.appleTokenKeys) else {
                throw ConfigurationError(
                    variable: Settings.appleTokenKeys.info.name, message: "is required: give the keyring, the new key first (`siwa-events apple token-key`)")
            }
            let logger = try makeLogger(settings)
            try await Database.with(database, logger: logger) { database in
                let store = AppleTokenStore(client: database.client, logger: logger)
                let before = try await store.ciphertextsByKey()
                let unknown = before.keys.filter { !cipher.keyIDs.contains($0) }.sorted()
                guard unknown.isEmpty else {
                    throw ConfigurationError(
                        variable: Settings.appleTokenKeys.info.name,
                        message: "holds no key \(unknown.joined(separator: ", ")), under which kept tokens are encrypted: add it after the new key")
                }
                var (reencrypted, changed, failed) = (0, 0, 0)
                while true {
                    let batch = try await store.ciphertexts(notUnder: cipher.currentKeyID, limit: 500)
                    var progress = false
                    for stored in batch {
                        guard let replacement = try? cipher.reencrypt(stored.ciphertext, owner: stored.owner) else {
                            failed += 1
                            continue
                        }
                        progress = true
                        if try await store.replace(stored, with: replacement) { reencrypted += 1 } else { changed += 1 }
                    }
                    if batch.isEmpty || !progress { break }
                }
                try await store.auditReencryption(actor: cliActor, keyID: cipher.currentKeyID, reencrypted: reencrypted)
                let after = try await store.ciphertextsByKey()
                let unused = cipher.keyIDs.dropFirst().filter { (after[$0] ?? 0) == 0 }
                print("re-encrypted \(reencrypted) under key \(cipher.currentKeyID)\(changed > 0 ? " (\(changed) changed meanwhile)" : "")")
                for key in cipher.keyIDs { print("key \(key): \(after[key] ?? 0) kept token(s) and pending revocation(s)") }
                if !unused.isEmpty { print("unused now, can be dropped from SIWA_APPLE_TOKEN_KEYS: \(unused.joined(separator: ", "))") }
                if failed > 0 {
                    printError("siwa-events: \(failed) stored token(s) did not decrypt (altered, or stored for another account); they were left as they are")
                    throw ExitCode(1)
                }
            }
        }
    }

    struct Revocations: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "List revocations of kept tokens at Apple (lane apple_revocations), newest first.",
            discussion: """
                Examples:
                  siwa-events apple revocations
                  siwa-events apple revocations --failed --json
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Flag(help: "Only those not taken by Apple (yet) after an attempt: retrying or discarded.") var failed = false
        @OptionGroup var user: UserFilter
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            try ListFlags.checkLimit(limit)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let jobs = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).listAppleRevocations(failed: failed, aud: user.aud, sub: user.sub, limit: limit)
            }
            if json {
                for job in jobs { print(job.json.jsonText) }
            } else if jobs.isEmpty {
                print("no revocations match")
            } else {
                print(table(
                    ["ID", "STATE", "ATTEMPT", "CLIENT ID", "SUB", "TOKEN", "CREATED", "LAST STATUS", "LAST ERROR"],
                    jobs.map {
                        [
                            "\($0.id)", $0.state.rawValue, "\($0.attempt)", $0.clientID, $0.sub, $0.fingerprint.map { "sha256:\($0)" } ?? "-",
                            iso8601($0.createdAt), $0.lastStatus.map(String.init) ?? "-", $0.lastError ?? "-",
                        ]
                    }))
            }
        }
    }

    struct Retry: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "Put a revocation, or every discarded one, back in the queue (fresh attempts).",
            discussion: """
                Examples:
                  siwa-events apple retry 42
                  siwa-events apple retry --discarded
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @Argument(help: "The revocation's job id (see `apple revocations`).") var id: Int?
        @Flag(help: "Every discarded revocation.") var discarded = false

        func validate() throws {
            if (id == nil) == !discarded { throw ValidationError("give a revocation id, or --discarded (not both)") }
            if let id, id <= 0 { throw ValidationError("the id must be a positive job id, as `apple revocations` shows (got \(id))") }
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let count = try await Database.with(database, logger: logger) { database in
                try await JobQueue(client: database.client, logger: logger).retryAppleRevocations(id: id, discarded: discarded)
            }
            if count == 0, let id {
                printError("siwa-events: no revocation \(id) to retry (unknown id, completed, or being sent right now; see `apple revocations`)")
                throw ExitCode(1)
            }
            print("queued \(count) revocation\(count == 1 ? "" : "s")")
        }
    }

    struct Calls: SettingsCommand {
        static let configuration = CommandConfiguration(
            abstract: "The record of calls to Apple's /auth/token and /auth/revoke: what was sent (a fingerprint, never a token) and the answer.",
            discussion: """
                Examples:
                  siwa-events apple calls --aud com.example.app --sub 001234.abcd
                  siwa-events apple calls --job 42
                """)
        static let settingGroups: [SettingGroup] = [.database, .logging]
        @OptionGroup var user: UserFilter
        @Option(help: "Only the calls of this revocation job.") var job: Int?
        @Option(help: ListFlags.limitHelp) var limit: Int = 50
        @Flag(help: "One JSON object per line.") var json = false

        func validate() throws {
            try ListFlags.checkLimit(limit)
        }

        func run(_ settings: SettingSource) async throws {
            let database = try DatabaseSettings(settings)
            let logger = try makeLogger(settings)
            let calls = try await Database.with(database, logger: logger) { database in
                try await AppleTokenStore(client: database.client, logger: logger).calls(aud: user.aud, sub: user.sub, jobID: job, limit: limit)
            }
            if json {
                for call in calls { print(call.json.jsonText) }
            } else if calls.isEmpty {
                print("no calls match")
            } else {
                print(table(
                    ["AT", "ENDPOINT", "CLIENT ID", "SENT", "TOKEN", "STATUS", "ERROR", "JOB"],
                    calls.map {
                        [
                            iso8601($0.at), $0.record.endpoint.rawValue, $0.record.clientID,
                            $0.record.grantType.map { "grant_type=\($0.rawValue)" } ?? $0.record.tokenTypeHint.map { "token_type_hint=\($0.rawValue)" } ?? "-",
                            "sha256:\($0.record.tokenFingerprint)", $0.record.status.map(String.init) ?? "none",
                            $0.record.error.map { $0.word ?? "unrecognised" } ?? "-", $0.jobID.map(String.init) ?? "-",
                        ]
                    }))
            }
        }
    }
}

/// `--aud A --sub S`: one user's, both or neither.
struct UserFilter: ParsableArguments {
    @Option(help: "Only this user's (with --sub): the app's bundle ID.") var aud: String?
    @Option(help: "Only this user's (with --aud): Apple's user identifier.") var sub: String?

    func validate() throws {
        if (aud == nil) != (sub == nil) { throw ValidationError("give --aud and --sub together") }
    }
}
