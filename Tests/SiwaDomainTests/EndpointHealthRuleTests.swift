import Foundation
import SiwaDomain
import Testing

/// `EndpointHealthRule`: when the latest endpoint check is unhealthy, and the alert series it opens.
@Suite("Endpoint health rule: failing checks, the certificate's days, the alert key", .timeLimit(.minutes(10)))
struct EndpointHealthRuleTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func report(_ findings: [EndpointFinding], expiresIn days: Double?) -> EndpointReport {
        EndpointReport(url: "https://siwa.example.com/apple/notifications", checkedAt: now, findings: findings, certificateExpiresAt: days.map { now.addingTimeInterval($0 * 86_400) })
    }

    @Test("the first failing check decides, warnings do not; an expiry under the days fires certificate with the days left")
    func verdicts() {
        let passing: [EndpointFinding] = [.init(.url, .ok, "…"), .init(.dns, .warn, "private"), .init(.tls, .ok, "TLS 1.3"), .init(.route, .ok, "400")]
        #expect(EndpointHealthRule.verdict(report(passing, expiresIn: 90), now: now, certificateDays: 14) == .healthy)
        #expect(EndpointHealthRule.verdict(report(passing, expiresIn: 14), now: now, certificateDays: 14) == .healthy, "exactly 14 days is not within 14")
        #expect(EndpointHealthRule.verdict(report(passing, expiresIn: 13.9), now: now, certificateDays: 14) == .expiring(days: 13))
        #expect(EndpointHealthRule.verdict(report(passing, expiresIn: -1), now: now, certificateDays: 14) == .expiring(days: -1))
        let failing = passing + [.init(.tls, .fail, "handshake"), .init(.route, .fail, "refused")]
        #expect(EndpointHealthRule.verdict(report(failing, expiresIn: nil), now: now, certificateDays: 14) == .failing(.tls))
        #expect(EndpointHealthRule.verdict(report(failing, expiresIn: 2), now: now, certificateDays: 14) == .failing(.tls), "a failure outranks the expiry")
    }

    @Test("the alert: nothing when healthy; type the failing check, or certificate with the days as its value")
    func observations() {
        let passing: [EndpointFinding] = [.init(.url, .ok, "…"), .init(.tls, .ok, "TLS 1.3"), .init(.route, .ok, "400")]
        #expect(EndpointHealthRule.observe(report(passing, expiresIn: 90), now: now, certificateDays: 14) == nil)
        let expiring = EndpointHealthRule.observe(report(passing, expiresIn: 3.5), now: now, certificateDays: 14)
        #expect(expiring?.key == AlertKey(kind: .endpointUnhealthy, type: "certificate"))
        #expect(expiring?.observation == AlertObservation(value: 3, baseline: nil, threshold: 14, breaching: true))
        let dns = EndpointHealthRule.observe(report([.init(.dns, .fail, "does not resolve")], expiresIn: nil), now: now, certificateDays: 14)
        #expect(dns?.key == AlertKey(kind: .endpointUnhealthy, type: "dns") && dns?.observation.breaching == true)
        let message = AlertMessage(
            id: 7, episode: AlertEpisode(key: expiring!.key, startedAt: now, value: 3, peak: 3, baseline: nil, threshold: 14), window: .seconds(300), resolvedAt: nil,
            joined: [])
        let text = EndpointHealthRule(certificateDays: 14, resolveAfter: .seconds(900)).text(message)
        #expect(text.contains("expires in 3 days (threshold 14): renew it"), "\(text)")
    }
}
