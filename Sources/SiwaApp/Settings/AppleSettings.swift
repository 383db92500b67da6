import Foundation
import SiwaApple
import SiwaDomain

extension Settings {
    package static let bundleIDs = Setting<[String]>(
        "SIWA_APPLE_BUNDLE_IDS", flag: "bundle-ids", .apple, default: [], shown: "— (required to serve)",
        help: "comma-separated bundle IDs accepted as aud (required to serve)",
        docs: "Comma-separated bundle IDs accepted as `aud`: the primary App ID of each app group (not a Services ID)."
    ) { text throws(SettingValueError) in
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
    package static let jwksURL = Setting<URL>(
        "SIWA_APPLE_JWKS_URL", flag: "jwks-url", .apple, default: AppleKeyCache.Configuration().sourceURL,
        shown: "`\(AppleKeyCache.Configuration().sourceURL.absoluteString)`",
        help: "Apple's key set (https://, or file://)",
        docs: "Apple's key set; `file://` accepted (local keys); `http://` only to a loopback address (tests)."
    ) { text throws(SettingValueError) in
        guard let url = URL(string: text), ["https", "http", "file"].contains(url.scheme?.lowercased() ?? "") else {
            throw SettingValueError("must be an https:// or file:// URL (got \"\(URLRedaction.scrubbed(text))\")")
        }
        if url.scheme?.lowercased() == "http" && !LoopbackHost.allowsCalls(to: url) {
            throw SettingValueError("is plain http:// to a non-loopback host (\(URLRedaction.redacted(url))): use https:// (a network attacker could serve its own keys), or file:// for local keys")
        }
        return url
    }
    package static let jwksMaximumAge = Setting<Duration>.duration(
        "SIWA_JWKS_MAX_AGE", flag: "jwks-max-age", .apple, default: AppleKeyCache.Configuration().maximumAge, minimum: .seconds(3600),
        help: "readiness fails when the key set in use is older (Apple unreachable)",
        docs: "While Apple is unreachable the last fetched (or stored) key set keeps verifying; past this age readiness fails and the log says why.")
    package static let jwksRefreshInterval = Setting<Duration>.duration(
        "SIWA_JWKS_REFRESH_INTERVAL", flag: "jwks-refresh-interval", .apple, default: AppleKeyCache.Configuration().refreshInterval,
        help: "scheduled key set refresh",
        docs: "Scheduled key-set refresh (every 15 s while none is loaded).")
    package static let unknownKidCooldown = Setting<Duration>.duration(
        "SIWA_JWKS_UNKNOWN_KID_COOLDOWN", flag: "jwks-unknown-kid-cooldown", .apple, default: AppleKeyCache.Configuration().unknownKidCooldown,
        help: "minimum time between unknown-kid refreshes",
        docs: "Minimum time between refreshes triggered by unknown `kid`s.")
    package static let clockSkew = Setting<Duration>.duration(
        "SIWA_CLOCK_SKEW", flag: "clock-skew", .apple, default: NotificationVerifier.defaultClockSkew,
        help: "allowance on exp/iat",
        docs: "Allowance on `exp`, `iat`, `nbf`.")
    package static let clientIDs = Setting<String?>.optionalText(
        "SIWA_APPLE_CLIENT_IDS", flag: "client-ids", .apple, shown: "the bundle IDs",
        help: "identity-token aud values accepted by POST /v1/sessions: id or servicesID=bundleID",
        docs: "`aud` values accepted in identity tokens by `POST /v1/sessions`: a bundle ID, or `servicesID=bundleID` for a web sign-in's Services ID (its users' accounts live under the bundle ID).")

    static let apple = [
        bundleIDs.info, jwksURL.info, jwksRefreshInterval.info, unknownKidCooldown.info, jwksMaximumAge.info, clockSkew.info, clientIDs.info,
    ]
}

/// What Apple's notifications and identity tokens are checked against, and where Apple's keys
/// come from.
package struct AppleSettings: Sendable {
    package var bundleIDs: [String]
    /// Identity-token client IDs → the bundle ID whose accounts they sign in to.
    package var clientIDs: [String: String]
    package var clockSkew: Duration
    package var keys: AppleKeyCache.Configuration

    /// `receiving`: this process checks notifications and identity tokens, so it needs bundle IDs
    /// and each client ID must name one of them.
    package init(_ source: SettingSource, receiving: Bool) throws(ConfigurationError) {
        bundleIDs = try source.value(Settings.bundleIDs)
        if receiving && bundleIDs.isEmpty {
            throw ConfigurationError(
                variable: Settings.bundleIDs.info.name,
                message: "is required: the comma-separated bundle IDs of your apps (Apple's aud), e.g. SIWA_APPLE_BUNDLE_IDS=com.example.app")
        }
        keys = try AppleKeyCache.Configuration(source)
        clockSkew = try source.value(Settings.clockSkew)
        clientIDs = Dictionary(bundleIDs.map { ($0, $0) }, uniquingKeysWith: { first, _ in first })
        if let text = source.text(Settings.clientIDs.info) {
            clientIDs = [:]
            for entry in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }).filter({ !$0.isEmpty }) {
                let parts = entry.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                let bundleID = parts.count == 2 ? parts[1] : parts[0]
                guard !parts[0].isEmpty, bundleIDs.contains(bundleID) || !receiving else {
                    throw ConfigurationError(
                        variable: Settings.clientIDs.info.name,
                        message: "\(entry): a client ID must be one of SIWA_APPLE_BUNDLE_IDS, or servicesID=bundleID mapping a Services ID to one of them")
                }
                clientIDs[parts[0]] = bundleID
            }
        }
    }
}

extension AppleKeyCache.Configuration {
    /// The key set's source and refresh timing.
    init(_ source: SettingSource) throws(ConfigurationError) {
        self.init(
            sourceURL: try source.value(Settings.jwksURL), refreshInterval: try source.value(Settings.jwksRefreshInterval),
            unknownKidCooldown: try source.value(Settings.unknownKidCooldown), maximumAge: try source.value(Settings.jwksMaximumAge))
    }
}
