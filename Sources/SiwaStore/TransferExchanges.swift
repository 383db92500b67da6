import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// Where the receiving side's exchanges stand.
package struct TransferImportProgress: Sendable, Equatable {
    package var total = 0
    package var exchanged = 0
    /// Of those exchanged, accounts of this database moved to their new sub.
    package var rekeyed = 0
    package var failed: [String: Int] = [:]
    package var pending: Int { total - exchanged - failed.values.reduce(0, +) }

    package init() {}
}

/// A user as Apple names them in this team after the transfer.
package struct MigratedUser: Sendable, Equatable {
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?

    package init(sub: String, email: String?, isPrivateEmail: Bool?) {
        self.sub = sub
        self.email = email
        self.isPrivateEmail = isPrivateEmail
    }
}

extension TransferStore {
    // MARK: Receiving side

    /// Adds `transferSubs` (an export's lines) to exchange; returns how many were new.
    @discardableResult
    package func importTransferSubs(_ transferSubs: [String], into transfer: Transfer) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH added AS (
                INSERT INTO transfer_imports (transfer_id, transfer_sub)
                SELECT me.id, v FROM unnest(\(transferSubs)::text[]) AS v, transfers me
                WHERE me.id = \(transfer.id) AND NOT EXISTS (\(unescaped: Self.erasedAccountSQL(transferSub: "v", clientID: "me.client_id")))
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT count(*)::bigint FROM added
            """, logger: logger)
    }

    /// When this database moved with the app: the sender's identifiers for our team, prepared
    /// here before the move, become the transfer_subs to exchange. Returns how many were new.
    @discardableResult
    package func importPrepared(into transfer: Transfer, ourTeam: String) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH added AS (
                INSERT INTO transfer_imports (transfer_id, transfer_sub)
                SELECT \(transfer.id), s.transfer_sub FROM transfer_subs s JOIN transfers t ON t.id = s.transfer_id
                WHERE t.direction = 'outgoing' AND t.client_id = \(transfer.clientID) AND t.team_id = \(ourTeam) AND s.transfer_sub IS NOT NULL
                  AND \(unescaped: Self.notErased(aud: "t.aud", sub: "s.sub"))
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT count(*)::bigint FROM added
            """, logger: logger)
    }

    package func pendingImports(of transfer: Transfer, limit: Int) async throws -> [String] {
        var values: [String] = []
        for try await (value,) in try await client.bounded.query(
            """
            SELECT transfer_sub FROM transfer_imports WHERE transfer_id = \(transfer.id) AND new_sub IS NULL AND error IS NULL
            ORDER BY transfer_sub LIMIT \(limit)
            """, logger: logger
        ).decode((String,).self) {
            values.append(value)
        }
        return values
    }

    /// Apple refused `transferSub` (e.g. the user revoked the app): kept with the word.
    package func recordRefusal(_ failure: TransferFailure, transferSub: String, of transfer: Transfer) async throws {
        try await client.bounded.query(
            """
            UPDATE transfer_imports SET error = \(failure.word), attempts = attempts + 1, updated_at = now()
            WHERE transfer_id = \(transfer.id) AND transfer_sub = \(transferSub)
            """, logger: logger)
    }

    /// Apple named `user` for `transferSub`: in one transaction, the account this database holds
    /// under the user's old sub is re-keyed (`rekeyAccount`); without one, an account is created
    /// under the new sub. Returns whether an account was re-keyed.
    @discardableResult
    package func rekey(transferSub: String, to user: MigratedUser, of transfer: Transfer) async throws -> Bool {
        let logger = self.logger
        let aud = transfer.aud
        return try await client.bounded.transaction(logger: logger) { connection in
            var erased = false
            for try await (found,) in try await connection.query(
                """
                SELECT EXISTS (SELECT 1 FROM (SELECT \(transferSub)::text AS v, \(transfer.clientID)::text AS c) x
                               WHERE EXISTS (\(unescaped: Self.erasedAccountSQL(transferSub: "x.v", clientID: "x.c"))))
                """, logger: logger
            ).decode((Bool,).self) {
                erased = found
            }
            if erased {
                // Erased here: neither moved to the new sub nor created under it.
                try await connection.query(
                    """
                    UPDATE transfer_imports SET error = 'erased', attempts = attempts + 1, updated_at = now()
                    WHERE transfer_id = \(transfer.id) AND transfer_sub = \(transferSub)
                    """, logger: logger)
                return false
            }
            let old = try await Self.rekeyAccount(
                aud: aud, clientID: transfer.clientID, transferSub: transferSub, to: user, transferID: transfer.id, on: connection, logger: logger)
            if old == nil {
                try await connection.query(
                    """
                    INSERT INTO accounts (aud, sub, email, is_private_email) VALUES (\(aud), \(user.sub), \(user.email), \(user.isPrivateEmail))
                    ON CONFLICT (aud, sub) DO NOTHING
                    """, logger: logger)
            }
            try await connection.query(
                """
                UPDATE transfer_imports SET new_sub = \(user.sub), old_sub = \(old), error = NULL, attempts = attempts + 1, updated_at = now()
                WHERE transfer_id = \(transfer.id) AND transfer_sub = \(transferSub)
                """, logger: logger)
            return old != nil
        }
    }

    /// A sign-in during the window whose identity token carries `transfer_sub`: the user's account
    /// is re-keyed now if the exchange has not reached it yet (and its import, if any, marked done),
    /// in the caller's transaction. Returns the old sub re-keyed, or nil (nothing to move).
    static func rekeyOnSignIn(
        aud: String, clientID: String, transferSub: String, newSub: String, on connection: PostgresConnection, logger: Logger
    ) async throws -> String? {
        let user = MigratedUser(sub: newSub, email: nil, isPrivateEmail: nil)
        guard let old = try await rekeyAccount(aud: aud, clientID: clientID, transferSub: transferSub, to: user, transferID: nil, on: connection, logger: logger)
        else { return nil }
        try await connection.query(
            """
            UPDATE transfer_imports i SET new_sub = \(newSub), old_sub = \(old), error = NULL, updated_at = now()
            FROM transfers t
            WHERE t.id = i.transfer_id AND t.direction = 'incoming' AND t.client_id = \(clientID) AND i.transfer_sub = \(transferSub) AND i.new_sub IS NULL
            """, logger: logger)
        return old
    }

    /// A query selecting 1 when `transferSub` (an SQL expression) names, through this database's
    /// prepared identifiers for client `clientID`, an account erased here.
    static func erasedAccountSQL(transferSub: String, clientID: String) -> String {
        """
        SELECT 1 FROM transfer_subs s JOIN transfers t ON t.id = s.transfer_id
        JOIN accounts a ON a.aud = t.aud AND a.sub = s.sub
        WHERE s.transfer_sub = \(transferSub) AND t.direction = 'outgoing' AND t.client_id = \(clientID) AND a.erased_at IS NOT NULL
        """
    }

    /// Moves the account held under the old sub that `transferSub` names (through the sender's
    /// prepared identifiers) to `user.sub`, with its sessions, notifications and queued jobs; the
    /// old sub is kept in `account_sub_changes`, the old team's kept Apple tokens dropped. Nil when
    /// there is no such account (or it was moved already), or an account under the new sub exists
    /// already (two accounts are never merged).
    private static func rekeyAccount(
        aud: String, clientID: String, transferSub: String, to user: MigratedUser, transferID: Int?, on connection: PostgresConnection, logger: Logger
    ) async throws -> String? {
        var old: String?
        for try await (sub,) in try await connection.query(
            """
            SELECT s.sub FROM transfer_subs s JOIN transfers t ON t.id = s.transfer_id
            JOIN accounts a ON a.aud = t.aud AND a.sub = s.sub
            WHERE s.transfer_sub = \(transferSub) AND t.direction = 'outgoing' AND t.client_id = \(clientID) AND t.aud = \(aud)
              AND s.sub <> \(user.sub) AND NOT EXISTS (SELECT 1 FROM accounts n WHERE n.aud = t.aud AND n.sub = \(user.sub)) AND a.erased_at IS NULL
            LIMIT 1
            FOR UPDATE OF a
            """, logger: logger
        ).decode((String,).self) {
            old = sub
        }
        guard let old else { return nil }
        try await connection.query("DELETE FROM apple_tokens WHERE aud = \(aud) AND sub = \(old)", logger: logger)
        try await connection.query(
            """
            UPDATE accounts SET sub = \(user.sub),
                email = CASE WHEN \(user.email)::text IS NOT NULL AND erased_at IS NULL THEN \(user.email) ELSE email END,
                is_private_email = coalesce(\(user.isPrivateEmail), is_private_email), updated_at = now()
            WHERE aud = \(aud) AND sub = \(old)
            """, logger: logger)
        try await connection.query("UPDATE sessions SET sub = \(user.sub) WHERE aud = \(aud) AND sub = \(old)", logger: logger)
        // Its notifications' jobs (before the notifications move). Its queued Apple revocations
        // stay under the sub their ciphertext is sealed for, so they still decrypt.
        try await JobQueue.rekeyNotificationJobs(aud: aud, from: old, to: user.sub, on: connection, logger: logger)
        try await NotificationStore.rekey(aud: aud, from: old, to: user.sub, on: connection, logger: logger)
        try await connection.query(
            """
            INSERT INTO account_sub_changes (aud, old_sub, new_sub, transfer_id) VALUES (\(aud), \(old), \(user.sub), \(transferID))
            ON CONFLICT (aud, old_sub) DO NOTHING
            """, logger: logger)
        return old
    }

    package func importProgress(of transfer: Transfer) async throws -> TransferImportProgress {
        var progress = TransferImportProgress()
        for try await (error, exchanged, rekeyed, n) in try await client.bounded.query(
            """
            SELECT error, new_sub IS NOT NULL, old_sub IS NOT NULL, count(*)::bigint FROM transfer_imports
            WHERE transfer_id = \(transfer.id) GROUP BY 1, 2, 3
            """, logger: logger
        ).decode((String?, Bool, Bool, Int).self) {
            progress.total += n
            if exchanged {
                progress.exchanged += n
                if rekeyed { progress.rekeyed += n }
            } else if let error {
                progress.failed[error, default: 0] += n
            }
        }
        return progress
    }

    /// Puts the refused transfer_subs back to pending; returns how many.
    @discardableResult
    package func retryRefusedImports(of transfer: Transfer) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH retried AS (
                UPDATE transfer_imports SET error = NULL, updated_at = now() WHERE transfer_id = \(transfer.id) AND error IS NOT NULL RETURNING 1
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger)
    }
}
