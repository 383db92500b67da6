import Foundation
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let spikeInterval = Setting<Duration>.duration(
        "SIWA_SPIKE_INTERVAL", flag: "spike-interval", .alerts, default: SpikeSettings().interval, minimum: .seconds(1),
        help: "how often alerts are evaluated",
        docs: "How often alerts are evaluated (by one process at a time).")
    package static let spikeWindow = Setting<Duration>(
        "SIWA_SPIKE_WINDOW", flag: "spike-window", .alerts, default: SpikeSettings().window, shown: "`\(DurationSyntax.format(SpikeSettings().window))`",
        help: "the window whose revocations are compared with the baseline",
        docs: "The window whose revocations are compared with the baseline (at most `6h`)."
    ) { text throws(SettingValueError) in
        let window = try Setting<Duration>.duration("", flag: "", .alerts, default: .zero, minimum: .seconds(1), help: "", docs: "").parse(text)
        guard window <= .seconds(6 * 3600) else { throw SettingValueError("must be at most 6h (per-second counts are kept a day)") }
        return window
    }
    package static let spikeMinCount = Setting<Int>.integer(
        "SIWA_SPIKE_MIN_COUNT", flag: "spike-min-count", .alerts, default: SpikeSettings().minCount, 1...10_000_000,
        help: "a spike needs at least this many revocations in the window",
        docs: "A spike needs at least this many revocations in the window…")
    package static let spikeFactor = Setting<Double>(
        "SIWA_SPIKE_FACTOR", flag: "spike-factor", .alerts, default: SpikeSettings().factor, shown: "`\(String(format: "%g", SpikeSettings().factor))`",
        help: "…and at least this many times the baseline",
        docs: "…and at least this many times the baseline."
    ) { text throws(SettingValueError) in
        guard let factor = Double(text), factor.isFinite, factor > 1, factor <= 1000 else {
            throw SettingValueError("must be a number above 1 and at most 1000, e.g. 5 or 2.5 (got \"\(text)\")")
        }
        return factor
    }
    package static let spikeNewAppCount = Setting<Int>.integer(
        "SIWA_SPIKE_NEW_APP_COUNT", flag: "spike-new-app-count", .alerts, default: SpikeSettings().newAppCount, 1...10_000_000,
        help: "an app with under a day of history fires at this many in the window",
        docs: "An app with under a day of history (no baseline) fires at this many in the window.")
    package static let spikeResolveAfter = Setting<Duration>.duration(
        "SIWA_SPIKE_RESOLVE_AFTER", flag: "spike-resolve-after", .alerts, default: SpikeSettings().resolveAfter,
        help: "an alert resolves after this long back to normal",
        docs: "An alert resolves after its series has been normal this long.")
    package static let alertWebhookURLs = Setting<[URL]>(
        "SIWA_ALERT_WEBHOOK_URLS", flag: "alert-webhook-urls", .alerts, default: [], shown: "none",
        help: "comma-separated http(s) URLs POSTed each alert, signed with SIWA_ALERT_SECRET",
        docs: "Comma-separated URLs POSTed each alert (JSON, signed with `SIWA_ALERT_SECRET`, Standard Webhooks)."
    ) { text throws(SettingValueError) in
        var urls: [URL] = []
        for part in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !part.isEmpty { urls.append(try parseWebURL(part)) }
        return urls
    }
    package static let alertSecret = Setting<String?>.optionalText(
        "SIWA_ALERT_SECRET", flag: "alert-secret", .alerts, shown: "— (required with alert webhook URLs)",
        help: "space-separated whsec_ secrets that sign alert webhooks (never a callback secret)",
        docs: "One or more space-separated `whsec_…` secrets that sign alert webhooks; must differ from every `SIWA_CALLBACK_SECRET`.",
        secret: true)
    package static let alertSlackURL = Setting<URL?>.webURL(
        "SIWA_ALERT_SLACK_URL", flag: "alert-slack-url", .alerts, shown: "none",
        help: "a Slack-compatible incoming-webhook URL for alerts",
        docs: "A Slack-compatible incoming-webhook URL (a message in words).", secret: true)
    package static let alertQueueLag = Setting<Duration>.duration(
        "SIWA_ALERT_QUEUE_LAG", flag: "alert-queue-lag", .alerts, default: AlertRuleSettings().queueLag, minimum: .seconds(1),
        help: "queue_lag fires when the oldest ready job has waited this long",
        docs: "`queue_lag` fires when the oldest ready job has waited this long.")
    package static let alertBadSignatures = Setting<Int>.integer(
        "SIWA_ALERT_BAD_SIGNATURES", flag: "alert-bad-signatures", .alerts, default: AlertRuleSettings().badSignatures, 1...10_000_000,
        help: "bad_signatures fires at this many in the spike window",
        docs: "`bad_signatures` fires at this many in the window (sampled-out ones count).")
    package static let alertDiscardedJobs = Setting<Int>.integer(
        "SIWA_ALERT_DISCARDED_JOBS", flag: "alert-discarded-jobs", .alerts, default: AlertRuleSettings().discardedJobs, 1...10_000_000,
        help: "jobs_discarded fires at this many discards in the spike window",
        docs: "`jobs_discarded` fires at this many discards in the window.")
    package static let alertSuppressionFailing = Setting<Duration>.duration(
        "SIWA_ALERT_SUPPRESSION_FAILING", flag: "alert-suppression-failing", .alerts, default: AlertRuleSettings().suppressionFailing, minimum: .seconds(1),
        help: "suppression_target_failing fires when a mail provider's operation has failed this long",
        docs: "`suppression_target_failing` fires when an operation at a mail provider has failed this long (or one ran out of attempts).")
    package static let alertTransferDays = Setting<Int>.integer(
        "SIWA_ALERT_TRANSFER_DAYS", flag: "alert-transfer-days", .alerts, default: TransferDeadlineSettings().days, 1...59,
        help: "transfer_deadline fires at this many days left in a transfer's window while users remain",
        docs: "`transfer_deadline` fires at this many days left in an app transfer's 60-day window while users remain…")
    package static let alertTransferLastDays = Setting<Int>.integer(
        "SIWA_ALERT_TRANSFER_LAST_DAYS", flag: "alert-transfer-last-days", .alerts, default: TransferDeadlineSettings().lastDays, 1...59,
        help: "…and tells the sinks again at this many (fewer than SIWA_ALERT_TRANSFER_DAYS)",
        docs: "…and tells the sinks again at this many (fewer than `SIWA_ALERT_TRANSFER_DAYS`).")
    package static let alertQuietOdds = Setting<Int>.integer(
        "SIWA_ALERT_QUIET_ODDS", flag: "alert-quiet-odds", .alerts, default: Int(QuietSettings().odds), 100...1_000_000_000_000,
        help: "quiet_app fires when a gap without notifications had at most a 1-in-this chance under the app's history",
        docs: "`quiet_app` fires when an app's gap without notifications had at most a 1-in-this chance under its last 4 weeks (docs/operations.md).")
    package static let alertQuietMinHistory = Setting<Duration>.duration(
        "SIWA_ALERT_QUIET_MIN_HISTORY", flag: "alert-quiet-min-history", .alerts, default: QuietSettings().minimumHistory, minimum: .seconds(86_400),
        help: "an app heard from for less than this is never quiet",
        docs: "An app first heard from less than this long ago has no baseline: `quiet_app` leaves it alone.")
    package static let alertQuietMinGap = Setting<Duration>.duration(
        "SIWA_ALERT_QUIET_MIN_GAP", flag: "alert-quiet-min-gap", .alerts, default: QuietSettings().minimumGap, minimum: .seconds(600),
        help: "however busy the app, a gap shorter than this never fires quiet_app",
        docs: "However busy the app, a gap shorter than this never fires `quiet_app` (the floor).")

    static let alerts = [
        spikeInterval.info, spikeWindow.info, spikeMinCount.info, spikeFactor.info, spikeNewAppCount.info, spikeResolveAfter.info,
        alertWebhookURLs.info, alertSecret.info, alertSlackURL.info, alertQueueLag.info, alertBadSignatures.info, alertDiscardedJobs.info, alertSuppressionFailing.info,
        alertTransferDays.info, alertTransferLastDays.info, alertQuietOdds.info, alertQuietMinHistory.info, alertQuietMinGap.info,
    ]
}

extension AlertMonitor.Configuration {
    /// The alert rules, and the sinks their alerts go to.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        sinks = try AlertSinks(source)
        rules.spike = try SpikeSettings(source)
        rules.queueLag = try source.value(Settings.alertQueueLag)
        rules.badSignatures = try source.value(Settings.alertBadSignatures)
        rules.discardedJobs = try source.value(Settings.alertDiscardedJobs)
        rules.suppressionFailing = try source.value(Settings.alertSuppressionFailing)
        rules.transferDeadline.days = try source.value(Settings.alertTransferDays)
        rules.transferDeadline.lastDays = try source.value(Settings.alertTransferLastDays)
        endpoint = try EndpointHealthSettings(source)
        guard rules.transferDeadline.lastDays < rules.transferDeadline.days else {
            throw ConfigurationError(
                variable: Settings.alertTransferLastDays.info.name,
                message: "must be fewer than SIWA_ALERT_TRANSFER_DAYS (\(rules.transferDeadline.days)): the second notice comes after the first (got \(rules.transferDeadline.lastDays))")
        }
        rules.quiet.odds = Double(try source.value(Settings.alertQuietOdds))
        rules.quiet.minimumHistory = try source.value(Settings.alertQuietMinHistory)
        rules.quiet.minimumGap = try source.value(Settings.alertQuietMinGap)
    }
}

extension SpikeSettings {
    /// When revocations count as a spike.
    init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        interval = try source.value(Settings.spikeInterval)
        window = try source.value(Settings.spikeWindow)
        resolveAfter = try source.value(Settings.spikeResolveAfter)
        minCount = try source.value(Settings.spikeMinCount)
        newAppCount = try source.value(Settings.spikeNewAppCount)
        factor = try source.value(Settings.spikeFactor)
    }
}

extension AlertSinks {
    /// Where alerts go: webhooks, signed with a secret of their own (so whoever verifies alerts
    /// cannot forge callbacks), and Slack.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        self.init(webhooks: try source.value(Settings.alertWebhookURLs), slack: try source.value(Settings.alertSlackURL))
        if source.text(Settings.alertWebhookURLs.info) != nil {
            signer = try WebhookSigner(
                source, Settings.alertSecret, requiredBy: "SIWA_ALERT_WEBHOOK_URLS", "alert webhooks are signed with a secret of their own, never the callback secret")
            func secrets(_ setting: Setting<String?>) -> [Substring] {
                (source.text(setting.info) ?? "").split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" })
            }
            guard Set(secrets(Settings.alertSecret)).isDisjoint(with: secrets(Settings.callbackSecret)) else {
                throw ConfigurationError(
                    variable: Settings.alertSecret.info.name,
                    message: "must differ from every SIWA_CALLBACK_SECRET: whoever verifies alert webhooks could otherwise sign callbacks to your backend; create one with `siwa-events callbacks secret`")
            }
        } else if source.text(Settings.alertSecret.info) != nil {
            throw ConfigurationError(
                variable: Settings.alertWebhookURLs.info.name, message: "is not set, but SIWA_ALERT_SECRET is: set the alert webhook URLs, or unset the secret")
        }
    }
}
