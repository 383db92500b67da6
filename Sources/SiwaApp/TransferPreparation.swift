import Foundation
import Logging
import SiwaApple
import SiwaDomain
import SiwaStore

/// Asks Apple for one user's transfer identifier for the target team: the sending side's one call.
/// A refusal for that user is its `Result`; what stops every call (no access token, our
/// credentials refused, no answer) is thrown, so a rerun resumes instead of failing each user.
package protocol TransferSubSource: Sendable {
    func transferSub(of sub: String) async throws -> Result<String, TransferFailure>
}

/// `transfers prepare`, the sending side: every known user of the transferred app gets their
/// `transfer_sub` for the target team, a batch at a time. Resumable (what is computed is kept;
/// a rerun asks only for the rest), per-user refusals kept for `--retry-failed`, never stopping
/// the batch. The caller paces the calls (`pace` before each).
package struct TransferPreparation: Sendable {
    let store: TransferStore
    let transfer: Transfer
    let source: any TransferSubSource

    package init(store: TransferStore, transfer: Transfer, source: any TransferSubSource) {
        self.store = store
        self.transfer = transfer
        self.source = source
    }

    /// One batch of up to `limit` pending users, `concurrency` calls in flight; returns how many
    /// were asked for (0: none left).
    @discardableResult
    package func runOnce(limit: Int, concurrency: Int = 1, pace: @escaping @Sendable () async throws -> Void = {}) async throws -> Int {
        let subs = try await store.pendingSubs(of: transfer, limit: limit)
        let (store, transfer, source) = (self.store, self.transfer, self.source)
        try await eachUser(subs, concurrency: concurrency) { sub in
            try await pace()
            try await store.record(try await source.transferSub(of: sub), sub: sub, of: transfer)
        }
        return subs.count
    }
}

/// Runs `body` for each of `items`, at most `concurrency` at once. The first runs alone, so the
/// access token it fetches is cached before the others ask. The first error cancels the rest:
/// what they had not recorded stays pending, for a rerun.
func eachUser(_ items: [String], concurrency: Int, _ body: @escaping @Sendable (String) async throws -> Void) async throws {
    guard let first = items.first else { return }
    try await body(first)
    try await withThrowingTaskGroup(of: Void.self) { group in
        var next = items.dropFirst().makeIterator()
        for _ in 0..<max(1, concurrency) {
            guard let item = next.next() else { break }
            group.addTask { try await body(item) }
        }
        while try await group.next() != nil {
            if let item = next.next() { group.addTask { try await body(item) } }
        }
    }
}

/// Asks Apple who a `transfer_sub` is in this team: the receiving side's one call, with the same
/// split as `TransferSubSource` (a refusal for that user is its `Result`; what stops every call
/// is thrown).
package protocol MigratedUserSource: Sendable {
    func migratedUser(_ transferSub: String) async throws -> Result<MigratedUser, TransferFailure>
}

/// `transfers exchange`, the receiving side: each imported `transfer_sub` becomes the user's sub
/// in this team, re-keying the account this database holds for them (or creating one), a user
/// per transaction. Resumable and idempotent: an exchanged user is never asked for again.
package struct TransferExchange: Sendable {
    let store: TransferStore
    let transfer: Transfer
    let source: any MigratedUserSource

    package init(store: TransferStore, transfer: Transfer, source: any MigratedUserSource) {
        self.store = store
        self.transfer = transfer
        self.source = source
    }

    /// One batch of up to `limit` pending transfer_subs, `concurrency` calls in flight; returns
    /// how many were asked for (0: none left).
    @discardableResult
    package func runOnce(limit: Int, concurrency: Int = 1, pace: @escaping @Sendable () async throws -> Void = {}) async throws -> Int {
        let pending = try await store.pendingImports(of: transfer, limit: limit)
        let (store, transfer, source) = (self.store, self.transfer, self.source)
        try await eachUser(pending, concurrency: concurrency) { transferSub in
            try await pace()
            switch try await source.migratedUser(transferSub) {
            case .success(let user): try await store.rekey(transferSub: transferSub, to: user, of: transfer)
            case .failure(let failure): try await store.recordRefusal(failure, transferSub: transferSub, of: transfer)
            }
        }
        return pending.count
    }
}

/// Apple's `/auth/usermigrationinfo`, both ways: the hour-long access token reused
/// (`MigrationTokenCache`), every call recorded in `apple_auth_calls`, Apple's 429 waited out a
/// second at a time (`rateLimitRetries` times) before the run stops.
package struct AppleMigrationCalls: TransferSubSource, MigratedUserSource {
    package struct Stopped: Error, CustomStringConvertible {
        package var description: String
    }

    let client: AppleAuthClient
    let tokens: MigrationTokenCache
    let clientID: String
    /// Sending side: the recipient team.
    let target: String?
    let calls: AppleTokenStore

    static let rateLimitRetries = 5

    package init(client: AppleAuthClient, tokens: MigrationTokenCache, clientID: String, target: String?, calls: AppleTokenStore) {
        self.client = client
        self.tokens = tokens
        self.clientID = clientID
        self.target = target
        self.calls = calls
    }

    package func transferSub(of sub: String) async throws -> Result<String, TransferFailure> {
        try await call { token in await client.transferSub(of: sub, target: target ?? "", clientID: clientID, accessToken: token) }
    }

    package func migratedUser(_ transferSub: String) async throws -> Result<MigratedUser, TransferFailure> {
        try await call { token in await client.migratedUser(transferSub: transferSub, clientID: clientID, accessToken: token) }
            .map { MigratedUser(sub: $0.sub, email: $0.email, isPrivateEmail: $0.isPrivateEmail) }
    }

    private func call<Value>(_ send: (String) async -> AppleAuthClient.Call<Value>) async throws -> Result<Value, TransferFailure> {
        for _ in 0..<Self.rateLimitRetries {
            let lookup = await tokens.token(clientID: clientID)
            if let fetched = lookup.call { try await calls.record(fetched.record, aud: nil, sub: nil) }
            let token: AppleMigrationToken
            switch lookup.result {
            case .success(let value): token = value
            case .failure(let failure): throw Stopped(description: "no migration access token from Apple: \(failure)")
            }
            let call = await send(token.accessToken)
            try await calls.record(call.record, aud: nil, sub: nil)
            switch call.result {
            case .success(let value):
                return .success(value)
            case .failure(.apple(let refusal)) where refusal == .invalidRequest:
                return .failure(TransferFailure(word: refusal.word ?? "invalid_request"))
            case .failure(.apple(let refusal)) where refusal == .invalidGrant || refusal == .invalidClient:
                tokens.forget(clientID: clientID)
                throw Stopped(description: "Apple refused the call (\(refusal)): check SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and the .p8; rerun to resume")
            case .failure(.apple(.unrecognised(429))):
                try await Task.sleep(for: .seconds(1))
            case .failure(let failure):
                throw Stopped(description: "\(failure); rerun to resume")
            }
        }
        throw Stopped(description: "Apple kept limiting the rate (HTTP 429): rerun with a lower --rate to resume")
    }
}
