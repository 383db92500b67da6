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
    /// accounts stay behind: their data is gone, and their `sub` is not handed on. An account this
    /// transfer already moved (re-keyed in place to the recipient's sub) is the recipient's user,
    /// not a new one of ours.
    @discardableResult
    package func listUsers(of transfer: Transfer) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH added AS (
                INSERT INTO transfer_subs (transfer_id, sub)
                SELECT \(transfer.id), a.sub FROM accounts a
                WHERE a.aud = \(transfer.aud) AND a.erased_at IS NULL
                  AND NOT EXISTS (
                      SELECT 1 FROM account_sub_changes c JOIN transfer_subs s ON s.transfer_id = \(transfer.id) AND s.sub = c.old_sub
                      WHERE c.aud = a.aud AND c.new_sub = a.sub)
                ON CONFLICT DO NOTHING
                RETURNING 1
            )
            SELECT count(*)::bigint FROM added
            """, logger: logger)
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
        return try await client.bounded.count(
            """
            WITH retried AS (
                UPDATE transfer_subs SET error = NULL, updated_at = now()
                WHERE transfer_id = \(transfer.id) AND error IS NOT NULL
                RETURNING 1
            )
            SELECT count(*)::bigint FROM retried
            """, logger: logger)
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

/// Why Apple gave no transfer identifier for a user: its error word, or no answer at all.
package struct TransferFailure: Error, Sendable, Equatable {
    /// Apple's word (`invalid_request`: e.g. the user revoked the app), `http_<status>`, or `no_answer`.
    package var word: String

    package init(word: String) { self.word = word }
}
