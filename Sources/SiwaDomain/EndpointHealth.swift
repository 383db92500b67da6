import Foundation

/// The endpoint check (`SIWA_PUBLIC_URL`, `SIWA_ENDPOINT_CHECK_INTERVAL`,
/// `SIWA_ALERT_CERTIFICATE_DAYS`): which URL Apple calls, how often one process checks it, and
/// how many days before the certificate expires `endpoint_unhealthy` fires. No URL: no check.
package struct EndpointHealthSettings: Sendable, Equatable {
    package var url: URL?
    package var interval: Duration = .seconds(3 * 3600)
    package var certificateDays = 14
    /// A PEM CA certificate to trust besides the system's (staging only: Apple trusts public CAs).
    package var caFile: String?
    /// Limit of each network check.
    package var timeout: Duration = .seconds(10)

    package init() {}
}

/// One check of the endpoint, in the order they run (doctor's lines use these names).
package enum EndpointCheck: String, Sendable, CaseIterable, Codable {
    case url, dns, tls, route
}

/// How one check went; `fail` makes the endpoint unhealthy, `warn` does not.
package enum EndpointCheckLevel: String, Sendable, Codable {
    case ok, warn, fail
}

/// One finding of a check: what doctor prints as one line, and /health lists.
package struct EndpointFinding: Sendable, Equatable, Codable {
    package var check: EndpointCheck
    package var level: EndpointCheckLevel
    package var detail: String

    package init(_ check: EndpointCheck, _ level: EndpointCheckLevel, _ detail: String) {
        self.check = check
        self.level = level
        self.detail = detail
    }
}

/// The outcome of checking the endpoint once: its findings in order, and the leaf certificate's
/// expiry when the handshake got that far.
package struct EndpointReport: Sendable, Equatable {
    package var url: String
    package var checkedAt: Date
    package var findings: [EndpointFinding]
    package var certificateExpiresAt: Date?

    package init(url: String, checkedAt: Date, findings: [EndpointFinding], certificateExpiresAt: Date?) {
        self.url = url
        self.checkedAt = checkedAt
        self.findings = findings
        self.certificateExpiresAt = certificateExpiresAt
    }

    /// The first check that failed, if any.
    package var failing: EndpointCheck? { findings.first { $0.level == .fail }?.check }
}

/// The endpoint's state as alerts, /health, metrics and the dashboard see it.
package enum EndpointVerdict: Sendable, Equatable {
    case healthy
    /// A check failed (the first one).
    case failing(EndpointCheck)
    /// Every check passed, but the certificate expires within the configured days.
    case expiring(days: Int)

    package var isHealthy: Bool { self == .healthy }
    /// The alert's cause: the failing check's name, or `certificate`.
    package var cause: String? {
        switch self {
        case .healthy: nil
        case .failing(let check): check.rawValue
        case .expiring: EndpointHealthRule.certificate
        }
    }
}

/// The `endpoint_unhealthy` rule, pure: the latest report is unhealthy when a check failed or the
/// certificate expires in fewer than `certificateDays` days. The alert's `type` is the cause (the
/// failing check, or `certificate` with the days left as its value), so each cause pages once.
/// It observes the latest report (nil: none yet, or no `SIWA_PUBLIC_URL`); an open episode whose
/// cause is gone resolves after `resolveAfter`.
package struct EndpointHealthRule: AlertRule {
    package static let certificate = "certificate"

    package let kind = AlertKind.endpointUnhealthy
    package var certificateDays: Int
    package var resolveAfter: Duration

    package init(certificateDays: Int, resolveAfter: Duration) {
        self.certificateDays = certificateDays
        self.resolveAfter = resolveAfter
    }

    package func step(_ report: EndpointReport?, open: [AlertEpisode], now: Date) -> [AlertDecision] {
        var observations: [AlertKey: AlertObservation] = [:]
        if let report, let unhealthy = Self.observe(report, now: now, certificateDays: certificateDays) {
            observations[unhealthy.key] = unhealthy.observation
        }
        return AlertLifecycle.step(observations, open: open, now: now, resolveAfter: resolveAfter)
    }

    package func subject(_ message: AlertMessage) -> String {
        let episode = message.episode
        return episode.key.type == Self.certificate
            ? "the certificate of the endpoint registered with Apple expires in \(episode.value) days (threshold \(Int(episode.threshold))): renew it"
            : "the endpoint registered with Apple fails its \(episode.key.type ?? "") check: see /health on the admin listener, or run siwa-events doctor"
    }

    /// Whole days from `now` until `expiry` (negative once expired), as doctor counts them.
    package static func days(until expiry: Date, now: Date) -> Int { Int(expiry.timeIntervalSince(now) / 86_400) }

    package static func verdict(_ report: EndpointReport, now: Date, certificateDays: Int) -> EndpointVerdict {
        if let check = report.failing { return .failing(check) }
        if let expiry = report.certificateExpiresAt, expiry.timeIntervalSince(now) < Double(certificateDays) * 86_400 {
            return .expiring(days: days(until: expiry, now: now))
        }
        return .healthy
    }

    /// The alert observation for `report` (nil when healthy: an open episode then goes quiet and
    /// resolves after the resolve delay).
    package static func observe(_ report: EndpointReport, now: Date, certificateDays: Int) -> (key: AlertKey, observation: AlertObservation)? {
        let verdict = verdict(report, now: now, certificateDays: certificateDays)
        let key = AlertKey(kind: .endpointUnhealthy, type: verdict.cause)
        switch verdict {
        case .healthy:
            return nil
        case .failing:
            return (key, .atLeast(1, value: 1))
        case .expiring(let days):
            return (key, AlertObservation(value: days, baseline: nil, threshold: Double(certificateDays), breaching: true))
        }
    }
}
