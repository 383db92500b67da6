import Foundation
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let suppressionTargets = Setting<[SuppressionTarget]>(
        "SIWA_SUPPRESSION_TARGETS", flag: "suppression-targets", .suppressions, default: [], shown: "none",
        help: "comma list of mail providers to keep in line: postmark, sendgrid, mailgun, resend, ses",
        docs: "Comma-separated mail providers whose suppression list follows Apple's events: `postmark`, `sendgrid`, `mailgun`, `resend`, `ses` (see [docs/reference.md, \"Suppressions\"](docs/reference.md#suppressions)). Unset: the feed only."
    ) { text throws(SettingValueError) in
        var targets: [SuppressionTarget] = []
        for name in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces).lowercased() }) where !name.isEmpty {
            guard let target = SuppressionTarget(rawValue: name) else {
                throw SettingValueError("names \"\(name)\", which is not one of postmark, sendgrid, mailgun, resend, ses")
            }
            if !targets.contains(target) { targets.append(target) }
        }
        return targets
    }
    package static let suppressOnConsentRevoked = Setting<Bool>.boolean(
        "SIWA_SUPPRESS_ON_CONSENT_REVOKED", flag: "suppress-on-consent-revoked", .suppressions, default: false, shownAs: ("on", "off"),
        help: "consent-revoked suppresses the user's addresses too",
        docs: "`consent-revoked` suppresses the user's addresses too (for apps that stop mailing users who leave).")
    package static let postmarkToken = Setting<String?>.optionalText(
        "SIWA_POSTMARK_TOKEN", flag: "postmark-token", .suppressions, shown: "— (required for postmark)",
        help: "Postmark server token", docs: "Postmark server API token (`X-Postmark-Server-Token`).", secret: true)
    package static let postmarkStream = Setting<String>.text(
        "SIWA_POSTMARK_STREAM", flag: "postmark-stream", .suppressions, default: "outbound",
        help: "Postmark message stream whose suppressions are kept", docs: "Postmark message stream whose suppression list is kept.")
    package static let postmarkURL = baseURL("POSTMARK", "https://api.postmarkapp.com", "Postmark")
    package static let sendgridKey = Setting<String?>.optionalText(
        "SIWA_SENDGRID_API_KEY", flag: "sendgrid-api-key", .suppressions, shown: "— (required for sendgrid)",
        help: "SendGrid API key (suppressions scope)", docs: "SendGrid API key with access to suppressions (global unsubscribes).", secret: true)
    package static let sendgridURL = baseURL("SENDGRID", "https://api.sendgrid.com", "SendGrid (EU: `https://api.eu.sendgrid.com`)")
    package static let mailgunKey = Setting<String?>.optionalText(
        "SIWA_MAILGUN_API_KEY", flag: "mailgun-api-key", .suppressions, shown: "— (required for mailgun)",
        help: "Mailgun API key", docs: "Mailgun API key (HTTP Basic, user `api`).", secret: true)
    package static let mailgunDomain = Setting<String?>.optionalText(
        "SIWA_MAILGUN_DOMAIN", flag: "mailgun-domain", .suppressions, shown: "— (required for mailgun)",
        help: "Mailgun sending domain whose bounces list is kept", docs: "Mailgun sending domain whose bounces list is kept.")
    package static let mailgunURL = baseURL("MAILGUN", "https://api.mailgun.net", "Mailgun (EU accounts: `https://api.eu.mailgun.net`)")
    package static let resendKey = Setting<String?>.optionalText(
        "SIWA_RESEND_API_KEY", flag: "resend-api-key", .suppressions, shown: "— (required for resend)",
        help: "Resend API key", docs: "Resend API key (its suppressions API).", secret: true)
    package static let resendURL = baseURL("RESEND", "https://api.resend.com", "Resend")
    package static let sesRegion = Setting<String?>.optionalText(
        "SIWA_SES_REGION", flag: "ses-region", .suppressions, shown: "— (required for ses)",
        help: "AWS region of the SES account (e.g. eu-west-1)", docs: "AWS region of the SES v2 account-level suppression list, e.g. `eu-west-1`.")
    package static let sesURL = Setting<URL?>.webURL(
        "SIWA_SES_URL", flag: "ses-url", .suppressions, shown: "`https://email.<region>.amazonaws.com`",
        help: "SES API base URL (default: the region's endpoint)", docs: "SES v2 API base URL; a path is kept. Default: the region's endpoint.")
    package static let awsAccessKeyID = Setting<String?>.optionalText(
        "AWS_ACCESS_KEY_ID", flag: "aws-access-key-id", .suppressions, shown: "— (required for ses)",
        help: "AWS access key ID for SES", docs: "AWS access key ID that signs SES requests (Signature Version 4).")
    package static let awsSecretAccessKey = Setting<String?>.optionalText(
        "AWS_SECRET_ACCESS_KEY", flag: "aws-secret-access-key", .suppressions, shown: "— (required for ses)",
        help: "AWS secret access key for SES", docs: "Its secret access key.", secret: true)
    package static let awsSessionToken = Setting<String?>.optionalText(
        "AWS_SESSION_TOKEN", flag: "aws-session-token", .suppressions, shown: "none",
        help: "AWS session token (temporary credentials)", docs: "Session token of temporary credentials.", secret: true)

    static func baseURL(_ name: String, _ value: String, _ provider: String) -> Setting<URL> {
        Setting<URL>(
            "SIWA_\(name)_URL", flag: "\(name.lowercased())-url", .suppressions, default: URL(string: value)!, shown: "`\(value)`",
            help: "\(provider.split(separator: " ").first ?? "") API base URL (a path is kept)", docs: "\(provider) API base URL; a path is kept (a proxy, the stand-in)."
        ) { text throws(SettingValueError) in try parseWebURL(text) }
    }

    static let suppressions = [
        suppressionTargets.info, suppressOnConsentRevoked.info, postmarkToken.info, postmarkStream.info, postmarkURL.info, sendgridKey.info, sendgridURL.info,
        mailgunKey.info, mailgunDomain.info, mailgunURL.info, resendKey.info, resendURL.info, sesRegion.info, sesURL.info, awsAccessKeyID.info,
        awsSecretAccessKey.info, awsSessionToken.info,
    ]
}

extension MailProviders {
    /// The providers `SIWA_SUPPRESSION_TARGETS` names, each with what it requires, or nil when
    /// none is named. A named provider without its key is an error naming the variable.
    static func configured(_ source: SettingSource, apps: [String]) throws(ConfigurationError) -> Self? {
        let targets = try source.value(Settings.suppressionTargets)
        guard !targets.isEmpty else { return nil }
        func required(_ setting: Setting<String?>, _ target: SuppressionTarget) throws(ConfigurationError) -> String {
            guard let value = try source.value(setting), !value.isEmpty else {
                throw ConfigurationError(variable: setting.info.name, message: "is required when SIWA_SUPPRESSION_TARGETS names \(target.rawValue)")
            }
            return value
        }
        var providers: [Provider] = []
        for target in targets {
            switch target {
            case .postmark:
                let account = MailProviderAccount.postmark(token: try required(Settings.postmarkToken, target), stream: try source.value(Settings.postmarkStream))
                providers.append(Provider(account: account, baseURL: try source.value(Settings.postmarkURL)))
            case .sendgrid:
                providers.append(Provider(account: .sendgrid(apiKey: try required(Settings.sendgridKey, target)), baseURL: try source.value(Settings.sendgridURL)))
            case .mailgun:
                let account = MailProviderAccount.mailgun(apiKey: try required(Settings.mailgunKey, target), domain: try required(Settings.mailgunDomain, target))
                providers.append(Provider(account: account, baseURL: try source.value(Settings.mailgunURL)))
            case .resend:
                providers.append(Provider(account: .resend(apiKey: try required(Settings.resendKey, target)), baseURL: try source.value(Settings.resendURL)))
            case .ses:
                let region = try required(Settings.sesRegion, target)
                guard region.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" }) else {
                    throw ConfigurationError(variable: Settings.sesRegion.info.name, message: "must be an AWS region like eu-west-1 (got \"\(region)\")")
                }
                let signer = AWSSignatureV4(
                    accessKeyID: try required(Settings.awsAccessKeyID, target), secretAccessKey: try required(Settings.awsSecretAccessKey, target),
                    sessionToken: try source.value(Settings.awsSessionToken), region: region, service: "ses")
                let url = try source.value(Settings.sesURL) ?? URL(string: "https://email.\(region).amazonaws.com")!
                providers.append(Provider(account: .ses(signer), baseURL: url))
            }
        }
        return MailProviders(providers: providers, apps: Set(apps))
    }
}
