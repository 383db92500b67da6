import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A transfer of an app between developer teams, as recorded (`transfers`).
package struct Transfer: Sendable, Equatable {
    package enum Direction: String, Sendable { case outgoing, incoming }

    package var id: Int
    package var direction: Direction
    package var clientID: String
    package var aud: String
    /// Outgoing: the recipient team (`target`); incoming: the sending team.
    package var teamID: String
    /// The transfer's date: Apple's 60-day window starts here.
    package var transferredAt: Date
}

/// Where the sending side's identifiers stand.
package struct TransferSubProgress: Sendable, Equatable {
    package var total = 0
    package var computed = 0
    /// Users whose call failed, by Apple's word (or the failure), kept for a retry.
    package var failed: [String: Int] = [:]
    package var pending: Int { total - computed - failed.values.reduce(0, +) }

    package init(total: Int = 0, computed: Int = 0, failed: [String: Int] = [:]) {
        self.total = total
        self.computed = computed
        self.failed = failed
    }
}

/// App transfers: the transfer rows and the sending side's transfer identifiers; every statement.
package struct TransferStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    private static let columns = "id, direction, client_id, aud, team_id, transferred_at"
    private typealias Row = (Int, String, String, String, String, Date)

    private static func transfer(_ row: Row) -> Transfer? {
        guard let direction = Transfer.Direction(rawValue: row.1) else { return nil }
        return Transfer(id: row.0, direction: direction, clientID: row.2, aud: row.3, teamID: row.4, transferredAt: row.5)
    }

    /// Records a transfer, or returns the one recorded for the same app, direction and team (its
    /// date updated when `transferredAt` is given). A new one without a date takes that of the
    /// transfer of the same app to `ourTeam` recorded here (the database moved with the app),
    /// else today.
    package func start(
        _ direction: Transfer.Direction, clientID: String, aud: String, teamID: String, transferredAt: Date?, actor: String, ourTeam: String? = nil
    ) async throws -> Transfer {
        for try await row in try await client.bounded.query(
            """
            INSERT INTO transfers AS t (direction, client_id, aud, team_id, transferred_at, created_by)
            VALUES (\(direction.rawValue), \(clientID), \(aud), \(teamID), coalesce(\(transferredAt)::timestamptz, (
                SELECT o.transferred_at FROM transfers o WHERE o.direction = 'outgoing' AND o.client_id = \(clientID) AND o.team_id = \(ourTeam)
            ), now()), \(actor))
            ON CONFLICT (direction, client_id, team_id) DO UPDATE
                SET transferred_at = coalesce(\(transferredAt)::timestamptz, t.transferred_at), aud = excluded.aud
            RETURNING \(unescaped: Self.columns)
            """, logger: logger
        ).decode(Row.self) {
            if let transfer = Self.transfer(row) { return transfer }
        }
        preconditionFailure("INSERT … RETURNING returned no row")
    }

    /// Every transfer recorded, newest first.
    package func list() async throws -> [Transfer] {
        var transfers: [Transfer] = []
        for try await row in try await client.bounded.query(
            "SELECT \(unescaped: Self.columns) FROM transfers ORDER BY created_at DESC, id DESC", logger: logger
        ).decode(Row.self) {
            if let transfer = Self.transfer(row) { transfers.append(transfer) }
        }
        return transfers
    }

    /// Every transfer whose window is open at `now`, with the users it still needs Apple for:
    /// outgoing, transfer_subs not asked for; incoming, transfer_subs not exchanged. Refused users
    /// are not counted: Apple refused them for good until someone asks again.
    package func backlogs(now: Date) async throws -> [(transfer: Transfer, usersLeft: Int)] {
        var result: [(transfer: Transfer, usersLeft: Int)] = []
        for try await (id, direction, clientID, aud, teamID, transferredAt, left) in try await client.bounded.query(
            """
            SELECT t.id, t.direction, t.client_id, t.aud, t.team_id, t.transferred_at,
                CASE t.direction
                WHEN 'outgoing' THEN (SELECT count(*) FROM transfer_subs s WHERE s.transfer_id = t.id AND s.transfer_sub IS NULL AND s.error IS NULL)
                ELSE (SELECT count(*) FROM transfer_imports i WHERE i.transfer_id = t.id AND i.new_sub IS NULL AND i.error IS NULL)
                END
            FROM transfers t WHERE t.transferred_at > \(now)::timestamptz - \(Int(TransferWindow.length)) * interval '1 second'
            ORDER BY t.id
            """, logger: logger
        ).decode((Int, String, String, String, String, Date, Int).self) {
            if let transfer = Self.transfer((id, direction, clientID, aud, teamID, transferredAt)) { result.append((transfer, left)) }
        }
        return result
    }

    // MARK: Sending side

    /// Adds every known user of the transfer's app not listed yet; returns how many. Erased
    /// accounts stay behind: their data is gone, and their `sub` is not handed on.
    @discardableResult
    package func listUsers(of transfer: Transfer) async throws -> Int {
        var added = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH added AS (
                INSERT INTO transfer_subs (transfer_id, sub)
                SELECT \(transfer.id), sub FROM accounts WHERE aud = \(transfer.aud) AND erased_at IS NULL
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT count(*)::bigint FROM added
            """, logger: logger
        ).decode((Int,).self) {
            added = n
        }
        return added
    }

    /// Up to `limit` users whose identifier is still to be asked for, in `sub` order.
    package func pendingSubs(of transfer: Transfer, limit: Int) async throws -> [String] {
        var subs: [String] = []
        for try await (sub,) in try await client.bounded.query(
            """
            SELECT s.sub FROM transfer_subs s JOIN transfers t ON t.id = s.transfer_id
            WHERE s.transfer_id = \(transfer.id) AND s.transfer_sub IS NULL AND s.error IS NULL AND \(unescaped: Self.notErased(aud: "t.aud", sub: "s.sub"))
            ORDER BY s.sub LIMIT \(limit)
            """, logger: logger
        ).decode((String,).self) {
            subs.append(sub)
        }
        return subs
    }

    /// Records what Apple answered for `sub`: its identifier, or the failure (kept for a retry).
    package func record(_ outcome: Result<String, TransferFailure>, sub: String, of transfer: Transfer) async throws {
        let (transferSub, error): (String?, String?) =
            switch outcome {
            case .success(let value): (value, nil)
            case .failure(let failure): (nil, failure.word)
            }
        try await client.bounded.query(
            """
            UPDATE transfer_subs SET transfer_sub = \(transferSub), error = \(error), attempts = attempts + 1, updated_at = now()
            WHERE transfer_id = \(transfer.id) AND sub = \(sub)
            """, logger: logger)
    }

    /// Puts the users whose call failed back to pending; returns how many.
    @discardableResult
    package func retryFailed(of transfer: Transfer) async throws -> Int {
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH retried AS (
                UPDATE transfer_subs SET error = NULL, updated_at = now()
                WHERE transfer_id = \(transfer.id) AND error IS NOT NULL
                RETURNING 1
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }

    package func progress(of transfer: Transfer) async throws -> TransferSubProgress {
        var progress = TransferSubProgress()
        for try await (error, computed, n) in try await client.bounded.query(
            """
            SELECT error, transfer_sub IS NOT NULL, count(*)::bigint FROM transfer_subs WHERE transfer_id = \(transfer.id) GROUP BY 1, 2
            """, logger: logger
        ).decode((String?, Bool, Int).self) {
            progress.total += n
            if computed { progress.computed += n } else if let error { progress.failed[error, default: 0] += n }
        }
        return progress
    }

    /// Every computed identifier of a user not erased, in `sub` order: what the recipient needs,
    /// and only that.
    package func transferSubs(of transfer: Transfer) async throws -> [String] {
        var subs: [String] = []
        for try await (value,) in try await client.bounded.query(
            """
            SELECT s.transfer_sub FROM transfer_subs s JOIN transfers t ON t.id = s.transfer_id
            WHERE s.transfer_id = \(transfer.id) AND s.transfer_sub IS NOT NULL AND \(unescaped: Self.notErased(aud: "t.aud", sub: "s.sub"))
            ORDER BY s.sub
            """,
            logger: logger
        ).decode((String,).self) {
            subs.append(value)
        }
        return subs
    }
}

extension TransferStore {
    // MARK: Erasure

    /// A condition true when the account `aud`/`sub` (SQL expressions) is not erased.
    static func notErased(aud: String, sub: String) -> String {
        "NOT EXISTS (SELECT 1 FROM accounts e WHERE e.aud = \(aud) AND e.sub = \(sub) AND e.erased_at IS NOT NULL)"
    }

    /// Erased users leave every transfer, in the caller's transaction: their identifiers for
    /// another team (asked for or not) and the exchanges of those not made yet, so no later
    /// `prepare`, `export`, `import` or `exchange` hands them on.
    static func forget(erased users: [(aud: String, sub: String)], on connection: PostgresConnection, logger: Logger) async throws {
        guard !users.isEmpty else { return }
        try await connection.query(
            """
            WITH gone AS (
                DELETE FROM transfer_subs s USING transfers t, unnest(\(users.map(\.aud))::text[], \(users.map(\.sub))::text[]) AS u(aud, sub)
                WHERE t.id = s.transfer_id AND t.aud = u.aud AND s.sub = u.sub
                RETURNING t.client_id, s.transfer_sub
            )
            DELETE FROM transfer_imports i USING transfers t, gone g
            WHERE t.id = i.transfer_id AND t.direction = 'incoming' AND t.client_id = g.client_id AND i.transfer_sub = g.transfer_sub
              AND i.new_sub IS NULL
            """, logger: logger)
    }
}

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
        var added = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH added AS (
                INSERT INTO transfer_imports (transfer_id, transfer_sub)
                SELECT me.id, v FROM unnest(\(transferSubs)::text[]) AS v, transfers me
                WHERE me.id = \(transfer.id) AND NOT EXISTS (\(unescaped: Self.erasedAccountSQL(transferSub: "v", clientID: "me.client_id")))
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT count(*)::bigint FROM added
            """, logger: logger
        ).decode((Int,).self) {
            added = n
        }
        return added
    }

    /// When this database moved with the app: the sender's identifiers for our team, prepared
    /// here before the move, become the transfer_subs to exchange. Returns how many were new.
    @discardableResult
    package func importPrepared(into transfer: Transfer, ourTeam: String) async throws -> Int {
        var added = 0
        for try await (n,) in try await client.bounded.query(
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
            """, logger: logger
        ).decode((Int,).self) {
            added = n
        }
        return added
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
        var count = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH retried AS (
                UPDATE transfer_imports SET error = NULL, updated_at = now() WHERE transfer_id = \(transfer.id) AND error IS NOT NULL RETURNING 1
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger
        ).decode((Int,).self) {
            count = n
        }
        return count
    }
}

/// Why Apple gave no transfer identifier for a user: its error word, or no answer at all.
package struct TransferFailure: Error, Sendable, Equatable {
    /// Apple's word (`invalid_request`: e.g. the user revoked the app), `http_<status>`, or `no_answer`.
    package var word: String

    package init(word: String) { self.word = word }
}
