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
/// the batch. The gateway paces the calls.
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
    package func runOnce(limit: Int, concurrency: Int = 1) async throws -> Int {
        let subs = try await store.pendingSubs(of: transfer, limit: limit)
        let (store, transfer, source) = (self.store, self.transfer, self.source)
        try await eachUser(subs, concurrency: concurrency) { sub in
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
    package func runOnce(limit: Int, concurrency: Int = 1) async throws -> Int {
        let pending = try await store.pendingImports(of: transfer, limit: limit)
        let (store, transfer, source) = (self.store, self.transfer, self.source)
        try await eachUser(pending, concurrency: concurrency) { transferSub in
            switch try await source.migratedUser(transferSub) {
            case .success(let user): try await store.rekey(transferSub: transferSub, to: user, of: transfer)
            case .failure(let failure): try await store.recordRefusal(failure, transferSub: transferSub, of: transfer)
            }
        }
        return pending.count
    }
}

/// Apple's `/auth/usermigrationinfo`, both ways, through the gateway (the access token reused,
/// every call recorded, paced at the run's rate, Apple's 429s waited out): a refusal for the
/// user is theirs; what stops every call (no access token, our credentials refused, no answer,
/// Apple still limiting the rate) stops the run, which a rerun resumes.
package struct AppleMigrationCalls: TransferSubSource, MigratedUserSource {
    package struct Stopped: Error, CustomStringConvertible {
        package var description: String
    }

    let gateway: AppleGateway
    let clientID: String
    /// Sending side: the recipient team.
    let target: String?

    package init(gateway: AppleGateway, clientID: String, target: String?) {
        self.gateway = gateway
        self.clientID = clientID
        self.target = target
    }

    package func transferSub(of sub: String) async throws -> Result<String, TransferFailure> {
        try await outcome { try await gateway.transferSub(of: sub, target: target ?? "", clientID: clientID) }
    }

    package func migratedUser(_ transferSub: String) async throws -> Result<MigratedUser, TransferFailure> {
        try await outcome { try await gateway.migratedUser(transferSub: transferSub, clientID: clientID) }
            .map { MigratedUser(sub: $0.sub, email: $0.email, isPrivateEmail: $0.isPrivateEmail) }
    }

    private func outcome<Value>(_ send: () async throws -> AppleGateway.Recorded<Value>) async throws -> Result<Value, TransferFailure> {
        let call: AppleGateway.Recorded<Value>
        do {
            call = try await send()
        } catch let missing as AppleGateway.NoMigrationToken {
            throw Stopped(description: missing.description)
        }
        switch call.result {
        case .success(let value):
            return .success(value)
        case .failure(.apple(let refusal)) where refusal == .invalidRequest:
            return .failure(TransferFailure(word: refusal.word ?? "invalid_request"))
        case .failure(.apple(let refusal)) where refusal == .invalidGrant || refusal == .invalidClient:
            throw Stopped(description: "Apple refused the call (\(refusal)): check SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and the .p8; rerun to resume")
        case .failure where call.call.isRateLimited:
            throw Stopped(description: "Apple kept limiting the rate (HTTP 429): rerun with a lower --rate to resume")
        case .failure(let failure):
            throw Stopped(description: "\(failure); rerun to resume")
        }
    }
}
