import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// The latest endpoint check per URL (`endpoint_checks`): written by the process holding the
/// `endpoint_check` lease, read by every process for /health, metrics and the alert. Keyed by the
/// URL without its userinfo: a credential in SIWA_PUBLIC_URL is never stored.
package struct EndpointCheckStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    /// Replaces the stored result for `report.url`.
    package func save(_ report: EndpointReport) async throws {
        let findings = String(decoding: try JSONEncoder().encode(report.findings), as: UTF8.self)
        try await client.bounded.query(
            """
            INSERT INTO endpoint_checks (url, checked_at, failing, certificate_expires_at, findings)
            VALUES (\(URLRedaction.scrubbed(report.url)), \(report.checkedAt), \(report.failing?.rawValue), \(report.certificateExpiresAt), \(findings)::jsonb)
            ON CONFLICT (url) DO UPDATE SET checked_at = excluded.checked_at, failing = excluded.failing,
                certificate_expires_at = excluded.certificate_expires_at, findings = excluded.findings
            """, logger: logger)
    }

    /// The latest result for `url`, nil before its first check.
    package func latest(url: String) async throws -> EndpointReport? {
        let url = URLRedaction.scrubbed(url)
        for try await (checkedAt, expiresAt, findings) in try await client.bounded.query(
            "SELECT checked_at, certificate_expires_at, findings::text FROM endpoint_checks WHERE url = \(url)", logger: logger
        ).decode((Date, Date?, String).self) {
            let decoded = (try? JSONDecoder().decode([EndpointFinding].self, from: Data(findings.utf8))) ?? []
            return EndpointReport(url: url, checkedAt: checkedAt, findings: decoded, certificateExpiresAt: expiresAt)
        }
        return nil
    }
}
