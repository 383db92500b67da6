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
    /// date updated when `transferredAt` is given).
    package func start(
        _ direction: Transfer.Direction, clientID: String, aud: String, teamID: String, transferredAt: Date?, actor: String
    ) async throws -> Transfer {
        for try await row in try await client.bounded.query(
            """
            INSERT INTO transfers AS t (direction, client_id, aud, team_id, transferred_at, created_by)
            VALUES (\(direction.rawValue), \(clientID), \(aud), \(teamID), coalesce(\(transferredAt)::timestamptz, now()), \(actor))
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

    // MARK: Sending side

    /// Adds every known user of the transfer's app not listed yet; returns how many.
    @discardableResult
    package func listUsers(of transfer: Transfer) async throws -> Int {
        var added = 0
        for try await (n,) in try await client.bounded.query(
            """
            WITH added AS (
                INSERT INTO transfer_subs (transfer_id, sub)
                SELECT \(transfer.id), sub FROM accounts WHERE aud = \(transfer.aud)
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
            SELECT sub FROM transfer_subs WHERE transfer_id = \(transfer.id) AND transfer_sub IS NULL AND error IS NULL
            ORDER BY sub LIMIT \(limit)
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

    /// Every computed identifier, in `sub` order: what the recipient needs, and only that.
    package func transferSubs(of transfer: Transfer) async throws -> [String] {
        var subs: [String] = []
        for try await (value,) in try await client.bounded.query(
            "SELECT transfer_sub FROM transfer_subs WHERE transfer_id = \(transfer.id) AND transfer_sub IS NOT NULL ORDER BY sub",
            logger: logger
        ).decode((String,).self) {
            subs.append(value)
        }
        return subs
    }
}

/// Why Apple gave no transfer identifier for a user: its error word, or no answer at all.
package struct TransferFailure: Error, Sendable, Equatable {
    /// Apple's word (`invalid_request`: e.g. the user revoked the app), `http_<status>`, or `no_answer`.
    package var word: String

    package init(word: String) { self.word = word }
}
