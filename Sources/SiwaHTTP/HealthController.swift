import Foundation
import Hummingbird
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// `/health/live` (the process answers) and `/health/ready` (database reachable and, for a process
/// that receives notifications, a usable key set). On the public listener the key set's state is
/// one word (`loaded`, `loading`, `unavailable`); the key-set URL and fetch errors are for the
/// admin listener only. `/health`, on the admin listener only, is the latest check of the
/// endpoint registered with Apple (`SIWA_PUBLIC_URL`): informative, never a reason to be unready.
package struct HealthController: Sendable {
    let store: NotificationStore
    let keys: AppleKeyCache?
    let databaseTimeout: Duration
    /// The endpoint check's settings and results (nil: the admin `/health` is not served).
    let endpoint: (settings: EndpointHealthSettings, checks: EndpointCheckStore)?
    /// The queue, for the Apple revocations still waiting that the admin `/health` counts.
    let queue: JobQueue?
    /// The mail providers configured (`SIWA_SUPPRESSION_TARGETS`), whose lanes the admin `/health` shows.
    let suppressionTargets: [SuppressionTarget]
    let clock: @Sendable () -> Date

    package init(
        store: NotificationStore, keys: AppleKeyCache?, databaseTimeout: Duration, endpoint: (settings: EndpointHealthSettings, checks: EndpointCheckStore)? = nil,
        queue: JobQueue? = nil, suppressionTargets: [SuppressionTarget] = [], clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.suppressionTargets = suppressionTargets
        self.store = store
        self.keys = keys
        self.databaseTimeout = databaseTimeout
        self.endpoint = endpoint
        self.queue = queue
        self.clock = clock
    }

    /// Which listener the routes are on: what an answer may disclose.
    package enum Audience: Sendable { case publicListener, admin }

    package func register(on router: Router<SiwaRequestContext>, for audience: Audience) {
        router.get("/health/live") { _, _ in Response.json(.object(["status": .string("live")])) }
        router.get("/health/ready") { _, _ in
            var checks: [String: JSONValue] = [:]
            var ready = true
            do {
                try await withDeadline(databaseTimeout) { try await store.ping() }
                checks["database"] = .string("ok")
            } catch {
                checks["database"] = .string("unreachable")
                ready = false
            }
            if let keys {
                let readiness = keys.readiness()
                switch (readiness, audience) {
                case (.loaded, _): break
                case (.loading, _), (.unavailable, _): ready = false
                }
                switch (readiness, audience) {
                case (.loading(let detail), .admin), (.unavailable(let detail), .admin): checks["apple_keys"] = .string(detail)
                default: checks["apple_keys"] = .string(readiness.publicWord)
                }
            }
            return Response.json(
                .object(["status": .string(ready ? "ready" : "unready"), "checks": .object(checks)]),
                status: ready ? .ok : .serviceUnavailable)
        }
        if audience == .admin, let endpoint { registerEndpoint(on: router, endpoint) }
    }

    /// `GET /health`: `endpoint` is null without SIWA_PUBLIC_URL, else the URL, its `status`
    /// (`unchecked`, `healthy`, `unhealthy`), the `cause` (the failing check, or `certificate`),
    /// when it was checked, the certificate's expiry and days left, and each check's finding;
    /// `apple_revocations` counts the revocations Apple has not taken (`waiting`, `discarded`; null
    /// while the database does not answer); `suppressions`, each configured mail provider's lane
    /// (pending, retrying, dead letters, last success, the newest failure's words).
    private func registerEndpoint(on router: Router<SiwaRequestContext>, _ endpoint: (settings: EndpointHealthSettings, checks: EndpointCheckStore)) {
        let (databaseTimeout, clock, queue, targets) = (self.databaseTimeout, self.clock, self.queue, self.suppressionTargets)
        router.get("/health") { _, _ in
            var answer: [String: JSONValue] = ["endpoint": .null]
            if let queue {
                // Informative like the rest: an unreachable database makes it null, not the answer an error.
                let backlog = try? await withDeadline(databaseTimeout) { try await queue.appleRevocationBacklog() }
                answer["apple_revocations"] = backlog?.json ?? .null
                if !targets.isEmpty {
                    let lanes = try? await withDeadline(databaseTimeout) { try await queue.suppressionTargets() }
                    answer["suppressions"] = lanes.map { .array($0.filter { targets.contains($0.target) }.map(\.json)) } ?? .null
                }
            }
            guard let url = endpoint.settings.url else { return Response.json(.object(answer)) }
            var object: [String: JSONValue] = ["url": .string(URLRedaction.redacted(url)), "status": .string("unchecked")]
            if let report = try await withDeadline(databaseTimeout, { try await endpoint.checks.latest(url: url.absoluteString) }) {
                let now = clock()
                let verdict = EndpointHealthRule.verdict(report, now: now, certificateDays: endpoint.settings.certificateDays)
                object["status"] = .string(verdict.isHealthy ? "healthy" : "unhealthy")
                object["cause"] = verdict.cause.map(JSONValue.string) ?? .null
                object["checked_at"] = .string(iso8601(report.checkedAt))
                object["certificate_expires_at"] = report.certificateExpiresAt.map { .string(iso8601($0)) } ?? .null
                object["certificate_days_left"] = report.certificateExpiresAt.map { .number(Double(EndpointHealthRule.days(until: $0, now: now))) } ?? .null
                object["checks"] = .array(
                    report.findings.map { .object(["check": .string($0.check.rawValue), "level": .string($0.level.rawValue), "detail": .string($0.detail)]) })
            }
            answer["endpoint"] = .object(object)
            return Response.json(.object(answer))
        }
    }
}

extension SuppressionTargetStatus {
    var json: JSONValue {
        [
            "target": .string(target.rawValue), "pending": .number(Double(pending)), "retrying": .number(Double(retrying)),
            "discarded": .number(Double(discarded)), "last_success": lastSuccess.map { .string(iso8601($0)) } ?? .null,
            "last_error": lastError.map(JSONValue.string) ?? .null,
        ]
    }
}
