import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// Apple's key set as last fetched (`jwks_cache`), so a restart verifies before its first fetch.
extension NotificationStore {
    /// The key set last fetched from `sourceURL`. The cache is keyed by the URL without its
    /// userinfo: a mirror's credentials are never stored.
    package func loadKeySetDocument(sourceURL: String) async throws -> (document: String, fetchedAt: Date)? {
        let sourceURL = URLRedaction.scrubbed(sourceURL)
        let rows = try await client.bounded.query(
            "SELECT document, fetched_at FROM jwks_cache WHERE source_url = \(sourceURL)", logger: logger)
        for try await (document, fetchedAt) in rows.decode((String, Date).self) {
            return (document, fetchedAt)
        }
        return nil
    }

    package func saveKeySetDocument(sourceURL: String, document: String, fetchedAt: Date) async throws {
        let sourceURL = URLRedaction.scrubbed(sourceURL)
        try await client.bounded.query(
            """
            INSERT INTO jwks_cache (source_url, document, fetched_at) VALUES (\(sourceURL), \(document), \(fetchedAt))
            ON CONFLICT (source_url) DO UPDATE SET document = excluded.document, fetched_at = excluded.fetched_at
            WHERE jwks_cache.fetched_at < excluded.fetched_at
            """, logger: logger)
    }
}
