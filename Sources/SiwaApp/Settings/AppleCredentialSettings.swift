import Foundation
import SiwaApple
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let appleTeamID = Setting<String?>.optionalText(
        "SIWA_APPLE_TEAM_ID", flag: "apple-team-id", .appleCredentials, shown: "— (no calls to Apple)",
        help: "your Apple team ID: the client secrets' iss (with SIWA_APPLE_KEY_ID and SIWA_APPLE_PRIVATE_KEY_FILE)",
        docs: "Your team ID (10 characters, A-Z and 0-9): the `iss` of the client secrets signed for Apple's `/auth/token` and `/auth/revoke`. Set with `SIWA_APPLE_KEY_ID` and `SIWA_APPLE_PRIVATE_KEY_FILE`, or none of them.")
    package static let appleKeyID = Setting<String?>.optionalText(
        "SIWA_APPLE_KEY_ID", flag: "apple-key-id", .appleCredentials, shown: "—",
        help: "the ID of the Sign in with Apple key in SIWA_APPLE_PRIVATE_KEY_FILE",
        docs: "The key ID (10 characters) of the Sign in with Apple private key, as the developer portal shows it.")
    package static let applePrivateKeyFile = Setting<String?>.optionalText(
        "SIWA_APPLE_PRIVATE_KEY_FILE", flag: "apple-private-key-file", .appleCredentials, shown: "—",
        help: "the .p8 file of that key (read at start, never logged or stored)",
        docs: "Path of the key's `.p8` file (P-256, PEM). Read once at start; never logged, never stored in the database. A missing or unreadable file stops start-up naming this variable; `siwa-events doctor` checks that Apple accepts it.")
    package static let appleAuthURL = Setting<URL>(
        "SIWA_APPLE_AUTH_URL", flag: "apple-auth-url", .appleCredentials, default: AppleAuthClient.Configuration.appleAuthURL,
        shown: "`\(AppleAuthClient.Configuration.appleAuthURL.absoluteString)`",
        help: "base of Apple's /auth/token and /auth/revoke",
        docs: "Base URL of Apple's `/auth/token` and `/auth/revoke`; `http://` only to a loopback address (the local stand-in, `siwa-events standin serve`)."
    ) { text throws(SettingValueError) in
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), ["https", "http"].contains(scheme), url.host != nil else {
            throw SettingValueError("must be an https:// URL such as https://appleid.apple.com (got \"\(URLRedaction.scrubbed(text))\")")
        }
        if !LoopbackHost.allowsCalls(to: url) {
            throw SettingValueError("is plain http:// to a non-loopback host (\(URLRedaction.redacted(url))): use https://")
        }
        return url
    }

    package static let appleTokenKeys = Setting<AppleTokenCipher?>(
        "SIWA_APPLE_TOKEN_KEYS", flag: "apple-token-keys", .appleCredentials, default: nil, shown: "— (required with the credentials)",
        help: "space-separated base64 keys (32 bytes each) encrypting refresh tokens; the first encrypts",
        docs: "Space-separated base64 of 32 random bytes each (`siwa-events apple token-key` makes one): the AES-256-GCM keys that encrypt the refresh tokens kept from sign-ins. The first encrypts, every one decrypts; to rotate, put a new key first, run `siwa-events apple reencrypt`, then drop the old one. Required with the credentials above; a stored token under a key not listed stops start-up.",
        secret: true
    ) { text throws(SettingValueError) in
        do throws(AppleTokenCipher.KeyError) {
            return try AppleTokenCipher(keys: text)
        } catch {
            throw SettingValueError(error.description)
        }
    }
    package static let revokeOnAppleEvents = Setting<Bool>.boolean(
        "SIWA_APPLE_REVOKE_ON_EVENTS", flag: "apple-revoke-on-events", .appleCredentials, default: false, shownAs: (on: "on", off: "off"),
        help: "also revoke kept tokens at Apple on Apple's account-delete and consent-revoked",
        docs: "`true`: Apple's `account-delete` and `consent-revoked` also queue the user's kept tokens for `/auth/revoke`. Off by default: Apple has ended those tokens already, so they are deleted without a call.")

    package static let appleRevocationConcurrency = Setting<Int>.integer(
        "SIWA_APPLE_REVOCATION_CONCURRENCY", flag: "apple-revocation-concurrency", .appleCredentials,
        default: AppleRevocations.defaultConcurrency, 1...256,
        help: "revocations at Apple in flight at once per process",
        docs: "Revocations at Apple's `/auth/revoke` in flight at once, per worker process.")
    package static let validateAppleTokens = Setting<Bool>.boolean(
        "SIWA_APPLE_VALIDATE_TOKENS", flag: "apple-validate-tokens", .appleCredentials, default: false, shownAs: (on: "on", off: "off"),
        help: "validate each kept refresh token at Apple once a day; invalid_grant counts as consent-revoked",
        docs: "`on`: each kept refresh token is validated at Apple's `/auth/token` at most once a day (a day after it was kept or last validated). `invalid_grant` means the user revoked the app where no notification reached us: their sessions are revoked as on `consent-revoked`, and the call shows in the user's timeline.")
    package static let appleValidationsPerMinute = Setting<Int>.integer(
        "SIWA_APPLE_VALIDATIONS_PER_MINUTE", flag: "apple-validations-per-minute", .appleCredentials,
        default: AppleTokenValidator.Configuration().perMinute, 1...6000,
        help: "at most this many validation calls to Apple a minute, per process",
        docs: "With validation on: at most this many calls to Apple a minute, per worker process (Apple may throttle).")

    static let appleCredentials = [
        appleTeamID.info, appleKeyID.info, applePrivateKeyFile.info, appleAuthURL.info, appleTokenKeys.info, revokeOnAppleEvents.info,
        appleRevocationConcurrency.info, validateAppleTokens.info, appleValidationsPerMinute.info,
    ]
}

/// The team's credentials for Apple's auth endpoints: the client-secret policy (team ID), the key
/// (read from its `.p8` at start), where the endpoints are, and the keys that encrypt the refresh
/// tokens kept. Nil when none is configured.
package struct AppleCredentials: Sendable {
    package let policy: ClientSecretPolicy
    package let key: ClientSecretMinter.SigningKey
    /// One per process: every client made from these credentials shares its cached secrets.
    let minter: ClientSecretMinter
    package var authURL: URL
    package var tokenCipher: AppleTokenCipher
    /// Apple's own `account-delete`/`consent-revoked` also queue revocations.
    package var revokeOnAppleEvents: Bool
    /// Kept tokens are validated daily (nil: off).
    package var validation: AppleTokenValidator.Configuration?
    /// Revocations in flight at once.
    package var revocationConcurrency = AppleRevocations.defaultConcurrency

    /// All three of team ID, key ID and key file, or none; each checked, the key file read now.
    package static func configured(_ source: SettingSource) throws(ConfigurationError) -> AppleCredentials? {
        let trio = [Settings.appleTeamID, Settings.appleKeyID, Settings.applePrivateKeyFile]
        var values: [String?] = []
        for setting in trio { values.append(try source.value(setting).map { $0.trimmingCharacters(in: .whitespaces) }.flatMap { $0.isEmpty ? nil : $0 }) }
        let authURL = try source.value(Settings.appleAuthURL)
        let cipher = try source.value(Settings.appleTokenKeys)
        let revokeOnAppleEvents = try source.value(Settings.revokeOnAppleEvents)
        var validation: AppleTokenValidator.Configuration?
        if try source.value(Settings.validateAppleTokens) {
            validation = AppleTokenValidator.Configuration()
            validation?.perMinute = try source.value(Settings.appleValidationsPerMinute)
        }
        guard values.contains(where: { $0 != nil }) else {
            if cipher != nil {
                throw ConfigurationError(
                    variable: Settings.appleTokenKeys.info.name,
                    message: "is set, but SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and SIWA_APPLE_PRIVATE_KEY_FILE are not: refresh tokens are kept only from code exchanges, which need them")
            }
            for (setting, on) in [(Settings.revokeOnAppleEvents, revokeOnAppleEvents), (Settings.validateAppleTokens, validation != nil)] where on {
                throw ConfigurationError(
                    variable: setting.info.name, message: "is on, but SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and SIWA_APPLE_PRIVATE_KEY_FILE are not set: it calls Apple with them")
            }
            return nil
        }
        guard let teamID = values[0], let keyID = values[1], let path = values[2] else {
            let missing = zip(trio, values).filter { $0.1 == nil }.map(\.0.info.name)
            let given = zip(trio, values).filter { $0.1 != nil }.map(\.0.info.variable)
            throw ConfigurationError(
                variable: missing.joined(separator: ", "),
                message: "\(missing.count == 1 ? "is" : "are") required with \(given.joined(separator: " and ")): Apple's calls need the team ID, the key ID and the key's .p8 file (or unset all three)")
        }
        let policy: ClientSecretPolicy
        do {
            policy = try ClientSecretPolicy(teamID: teamID)
        } catch {
            throw ConfigurationError(variable: Settings.appleTeamID.info.name, message: error.description)
        }
        let key: ClientSecretMinter.SigningKey
        do {
            key = try ClientSecretMinter.SigningKey.load(path: path, keyID: keyID)
        } catch .invalidKeyID(let id) {
            throw ConfigurationError(variable: Settings.appleKeyID.info.name, message: ClientSecretMinter.SigningKey.LoadError.invalidKeyID(id).description)
        } catch {
            throw ConfigurationError(variable: Settings.applePrivateKeyFile.info.name, message: error.description)
        }
        guard let cipher else {
            throw ConfigurationError(
                variable: Settings.appleTokenKeys.info.name,
                message: "is required with the Apple credentials: refresh tokens are kept encrypted under it; make a key with `siwa-events apple token-key`")
        }
        return AppleCredentials(
            policy: policy, key: key, minter: ClientSecretMinter(policy: policy, key: key), authURL: authURL, tokenCipher: cipher,
            revokeOnAppleEvents: revokeOnAppleEvents, validation: validation,
            revocationConcurrency: try source.value(Settings.appleRevocationConcurrency))
    }

    /// A client for Apple's auth endpoints signing with these credentials (the secrets shared).
    package func client(timeout: Duration = .seconds(10)) -> AppleAuthClient {
        AppleAuthClient(
            configuration: .init(baseURL: authURL, timeout: timeout), minter: minter)
    }
}
