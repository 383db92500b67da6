import Foundation
import SiwaDomain
import Synchronization

/// The migration access token per client ID, fetched once and reused for its hour less `margin`
/// (`AppleMigrationToken.isUsable`), so a batch of transfers asks `/auth/token` once an hour.
/// Two callers missing at once may both fetch; the later token wins, both are valid.
package final class MigrationTokenCache: Sendable {
    /// A token to send, and the call that fetched it (nil when it came from the cache).
    package struct Lookup: Sendable {
        package var result: Result<AppleMigrationToken, AppleAuthClient.Failure>
        package var call: AppleAuthClient.Call<AppleMigrationToken>?
    }

    private let client: AppleAuthClient
    private let margin: TimeInterval
    private let now: @Sendable () -> Date
    private let tokens = Mutex<[String: (token: AppleMigrationToken, issuedAt: Date)]>([:])

    /// `now` dates tokens on receipt and decides their reuse (tests move it).
    package init(client: AppleAuthClient, margin: TimeInterval = 300, now: @escaping @Sendable () -> Date = { Date() }) {
        self.client = client
        self.margin = margin
        self.now = now
    }

    /// The cached token for `clientID` while usable, else a new one from Apple (kept on success).
    package func token(clientID: String) async -> Lookup {
        let at = now()
        if let kept = tokens.withLock({ $0[clientID] }), kept.token.isUsable(issuedAt: kept.issuedAt, now: at, margin: margin) {
            return Lookup(result: .success(kept.token), call: nil)
        }
        let call = await client.migrationAccessToken(clientID: clientID)
        if case .success(let token) = call.result { tokens.withLock { $0[clientID] = (token, at) } }
        return Lookup(result: call.result, call: call)
    }

    /// Forgets the token of `clientID`: Apple refused it (`invalid_grant`/`invalid_client`), so the next lookup fetches anew.
    package func forget(clientID: String) {
        _ = tokens.withLock { $0.removeValue(forKey: clientID) }
    }
}
