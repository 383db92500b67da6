import Foundation
import PostgresNIO
import SiwaDomain

/// The read of `apple_auth_calls` that `apple_credentials` makes, beside the store that records
/// the calls (`AppleTokenStore`).
extension AppleTokenStore {
    // MARK: CallsRefused

    /// Calls Apple answered with `error` since `since`.
    package func callsRefused(with error: AppleAuthError, since: Date) async throws -> Int {
        var refused = 0
        for try await (n,) in try await client.bounded.query(
            "SELECT count(*)::bigint FROM apple_auth_calls WHERE at >= \(since) AND error = \(error.word)", logger: logger
        ).decode((Int,).self) {
            refused = n
        }
        return refused
    }
}
