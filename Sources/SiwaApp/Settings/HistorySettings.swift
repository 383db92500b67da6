import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let rejectionsPerMinute = Setting<Int>.integer(
        "SIWA_REJECTIONS_PER_MINUTE", flag: "rejections-per-minute", .history, default: 60, 0...1_000_000,
        help: "rejection rows kept per reason per minute",
        docs: "Rejection rows kept per reason per minute; the rest are counted only.")
    package static let otherAppTokensPerHour = Setting<Int>.integer(
        "SIWA_OTHER_APP_TOKENS_PER_HOUR", flag: "other-app-tokens-per-hour", .history, default: RejectionSampler.defaultTokensPerAudiencePerHour, 0...1_000_000,
        help: "genuine tokens for an unknown bundle ID kept whole, per aud per hour (the rest counted)",
        docs: "Genuine (Apple-signed) notifications for a bundle ID that is not yours are kept whole, for `rejections replay` after a bundle-ID typo is fixed, at most this many per `aud` per hour; the rest are recorded without the token (sampled like any rejection). Apple signs every app's notifications with the same keys, so anyone can post their own app's here.")
    package static let otherAppTokenRetention = Setting<Duration>.duration(
        "SIWA_OTHER_APP_TOKEN_RETENTION", flag: "other-app-token-retention", .history, default: HistoryPruner.Configuration().otherAppTokenRetention, minimum: .seconds(1),
        help: "kept tokens for unknown bundle IDs are deleted after this",
        docs: "Such a kept token (it holds the other app's user's address) is deleted after this; the rejection row stays.")
    package static let historyRetention = Setting<Duration>.duration(
        "SIWA_HISTORY_RETENTION", flag: "history-retention", .history, default: HistoryPruner.Configuration().retention,
        help: "notifications and rejections older than this are pruned",
        docs: "Notifications (with their jobs and attempts) and rejections older than this are pruned in the background, 1,000 rows per statement.")

    static let history = [rejectionsPerMinute.info, otherAppTokensPerHour.info, otherAppTokenRetention.info, historyRetention.info]
}

/// The rejections the receiver keeps whole; the rest are counted only.
package struct RejectionLimits: Sendable {
    /// Rows kept per reason per minute.
    package var perMinute: Int
    /// Genuine tokens for another bundle ID kept whole, per `aud` per hour.
    package var otherAppTokensPerHour: Int

    package init(_ source: SettingSource) throws(ConfigurationError) {
        perMinute = try source.value(Settings.rejectionsPerMinute)
        otherAppTokensPerHour = try source.value(Settings.otherAppTokensPerHour)
    }
}

extension HistoryPruner.Configuration {
    /// How long history, and the tokens kept for other apps, stay.
    init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        retention = try source.value(Settings.historyRetention)
        otherAppTokenRetention = try source.value(Settings.otherAppTokenRetention)
    }
}
