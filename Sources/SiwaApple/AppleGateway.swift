import Foundation
import SiwaDomain

/// Every call to Apple's `/auth/*` goes through here: one HTTP client (`AppleAuthClient`), one
/// recorder that keeps what each sent call asked and what Apple answered, and one pacing and
/// 429 policy (`ApplePacing`). A 429 pauses every call of the process for Apple's `Retry-After`
/// and is retried, `rateLimitedAttempts` in all; each attempt is recorded. A call refused before
/// sending (its input cannot be valid) is not recorded. A thrown error is the recorder's: the
/// call went out but its record could not be written.
package struct AppleGateway: Sendable {
    /// Attempts of one call while Apple answers 429 (the last 429 is the call's answer).
    package static let rateLimitedAttempts = 5

    package let client: AppleAuthClient
    let recorder: any AppleCallRecorder
    let pacer: any ApplePacing
    let migrationTokens: MigrationTokenCache

    package init(client: AppleAuthClient, recorder: any AppleCallRecorder, pacer: any ApplePacing = ApplePacer(), now: @escaping @Sendable () -> Date = { Date() }) {
        self.client = client
        self.recorder = recorder
        self.pacer = pacer
        self.migrationTokens = MigrationTokenCache(client: client, now: now)
    }

    /// A call's outcome and the id of its record (nil: refused before sending, not recorded).
    package struct Recorded<Value: Sendable>: Sendable {
        package var call: AppleAuthClient.Call<Value>
        package var recordID: Int?

        package var record: AppleAuthRecord { call.record }
        package var result: Result<Value, AppleAuthClient.Failure> { call.result }
    }

    /// Sign-in completion: the authorization code for tokens. Recorded with no user (the answer
    /// names them); the sign-in attributes the record by its id.
    package func exchange(code: String, clientID: String, redirectURI: String? = nil) async throws -> Recorded<AppleTokenGrant> {
        try await paced(about: .none) { await client.exchange(code: code, clientID: clientID, redirectURI: redirectURI) }
    }

    /// Validates a kept refresh token.
    package func refresh(refreshToken: String, clientID: String, about subject: AppleCallSubject) async throws -> Recorded<AppleTokenGrant> {
        try await paced(about: subject) { await client.refresh(refreshToken: refreshToken, clientID: clientID) }
    }

    /// Revokes a token (Apple answers 200 to any token: the record is the proof).
    package func revoke(token: String, hint: AppleTokenKind, clientID: String, about subject: AppleCallSubject) async throws -> Recorded<Void> {
        try await paced(about: subject) { await client.revoke(token: token, hint: hint, clientID: clientID) }
    }

    /// Sending team: the `transfer_sub` of `sub` for the recipient team `target`.
    package func transferSub(of sub: String, target: String, clientID: String) async throws -> Recorded<String> {
        try await migrationCall(clientID: clientID) { token in await client.transferSub(of: sub, target: target, clientID: clientID, accessToken: token) }
    }

    /// Receiving team: the user behind a `transfer_sub`.
    package func migratedUser(transferSub: String, clientID: String) async throws -> Recorded<AppleMigratedUser> {
        try await migrationCall(clientID: clientID) { token in await client.migratedUser(transferSub: transferSub, clientID: clientID, accessToken: token) }
    }

    /// Apple gave no migration access token (the fetch is recorded): no migration call can go.
    package struct NoMigrationToken: Error, CustomStringConvertible {
        package var failure: AppleAuthClient.Failure
        package var description: String { "no migration access token from Apple: \(failure)" }
    }

    /// A `/auth/usermigrationinfo` call with the hour-long access token (fetched, and recorded,
    /// only when the cached one is not usable; forgotten when Apple refuses our credentials).
    private func migrationCall<Value>(
        clientID: String, _ send: @escaping @Sendable (String) async -> AppleAuthClient.Call<Value>
    ) async throws -> Recorded<Value> {
        try await paced(about: .none) {
            let lookup = await migrationTokens.token(clientID: clientID)
            if let fetched = lookup.call { try await record(fetched, about: .none) }
            switch lookup.result {
            case .success(let token):
                let call = await send(token.accessToken)
                if case .failure(.apple(let refusal)) = call.result, refusal == .invalidGrant || refusal == .invalidClient {
                    migrationTokens.forget(clientID: clientID)
                }
                return call
            case .failure(let failure):
                throw NoMigrationToken(failure: failure)
            }
        }
    }

    /// Admits, sends, records; a 429 pauses every call and is tried again.
    private func paced<Value>(about subject: AppleCallSubject, _ send: @Sendable () async throws -> AppleAuthClient.Call<Value>) async throws -> Recorded<Value> {
        var attempt = 1
        while true {
            try await pacer.admit()
            let call = try await send()
            let id = try await record(call, about: subject)
            guard call.isRateLimited, attempt < Self.rateLimitedAttempts else { return Recorded(call: call, recordID: id) }
            attempt += 1
            await pacer.limited(retryAfter: call.retryAfter)
        }
    }

    @discardableResult
    private func record<Value>(_ call: AppleAuthClient.Call<Value>, about subject: AppleCallSubject) async throws -> Int? {
        if case .failure(.invalidInput) = call.result { return nil }
        return try await recorder.record(call.record, about: subject)
    }
}
