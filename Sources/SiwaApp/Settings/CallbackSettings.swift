import Foundation
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let callbackURL = Setting<URL?>.webURL(
        "SIWA_CALLBACK_URL", flag: "callback-url", .callbacks, shown: "none",
        help: "http(s) endpoint POSTed a signed callback after each effect (unset: none)",
        docs: "`https://` (or `http://`) endpoint of your backend, POSTed a signed callback after each effect (see [docs/reference.md, \"Callbacks\"](docs/reference.md#callbacks)).")
    package static let callbackSecret = Setting<String?>.optionalText(
        "SIWA_CALLBACK_SECRET", flag: "callback-secret", .callbacks, shown: "— (required with a URL)",
        help: "space-separated whsec_ secrets that sign callbacks (all sign: rotation)",
        docs: "One or more space-separated `whsec_…` secrets; every one signs (rotation). `siwa-events callbacks secret` makes one.",
        secret: true)
    package static let callbackTimeout = Setting<Duration>.duration(
        "SIWA_CALLBACK_TIMEOUT", flag: "callback-timeout", .callbacks, default: Callbacks.defaultTimeout,
        help: "one callback attempt's limit",
        docs: "One delivery attempt's limit; longer is a failed attempt, retried.")
    package static let callbackConcurrency = Setting<Int>.integer(
        "SIWA_CALLBACK_CONCURRENCY", flag: "callback-concurrency", .callbacks, default: Callbacks.defaultConcurrency, 1...256,
        help: "callbacks in flight at once per process",
        docs: "Callbacks in flight at once per process.")

    static let callbacks = [callbackURL.info, callbackSecret.info, callbackTimeout.info, callbackConcurrency.info]
}

extension Callbacks {
    /// The backend's endpoint, or nil without SIWA_CALLBACK_URL: a URL needs a secret, and a secret a URL.
    static func configured(_ source: SettingSource) throws(ConfigurationError) -> Self? {
        guard let url = try source.value(Settings.callbackURL) else {
            guard source.text(Settings.callbackSecret.info) == nil else {
                throw ConfigurationError(
                    variable: Settings.callbackURL.info.name,
                    message: "is not set, but SIWA_CALLBACK_SECRET is: set the URL callbacks go to, or unset the secret (alert webhooks use SIWA_ALERT_SECRET)")
            }
            return nil
        }
        var callbacks = Self(url: url, signer: try WebhookSigner(source, Settings.callbackSecret, requiredBy: "SIWA_CALLBACK_URL", "callbacks are always signed"))
        callbacks.timeout = try source.value(Settings.callbackTimeout)
        callbacks.concurrency = try source.value(Settings.callbackConcurrency)
        return callbacks
    }
}

extension WebhookSigner {
    /// The `whsec_` secrets in `setting`, required because `user` (a variable) sends signed messages
    /// (`why`): callbacks, and alert webhooks.
    init(_ source: SettingSource, _ setting: Setting<String?>, requiredBy user: String, _ why: String) throws(ConfigurationError) {
        guard let secrets = source.text(setting.info) else {
            throw ConfigurationError(
                variable: setting.info.name, message: "is required when \(user) is set: \(why); create one with `siwa-events callbacks secret`")
        }
        do {
            try self.init(secrets: secrets)
        } catch {
            throw ConfigurationError(variable: setting.info.name, message: error.description)
        }
    }
}
