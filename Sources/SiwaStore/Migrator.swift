import Crypto
import Foundation
import Logging
import PostgresNIO

/// The files of `sql/`, embedded by SwiftPM (`Sources/SiwaStore/Migrations` links to `sql/`).
/// SwiftPM turns `001_receiver.sql` into `_01_receiver_sql`; a test checks this list against `sql/`.
let embedded: [(file: String, bytes: [UInt8])] = [
    ("001_receiver.sql", PackageResources._01_receiver_sql),
    ("002_effects.sql", PackageResources._02_effects_sql),
    ("003_callbacks.sql", PackageResources._03_callbacks_sql),
    ("004_backend_api.sql", PackageResources._04_backend_api_sql),
    ("005_history.sql", PackageResources._05_history_sql),
    ("006_stats_rollup.sql", PackageResources._06_stats_rollup_sql),
    ("007_alerts.sql", PackageResources._07_alerts_sql),
    ("008_hot_status.sql", PackageResources._08_hot_status_sql),
    ("009_effects_claim.sql", PackageResources._09_effects_claim_sql),
    ("010_effects_event_order.sql", PackageResources._10_effects_event_order_sql),
    ("011_session_consent.sql", PackageResources._11_session_consent_sql),
    ("012_kept_tokens.sql", PackageResources._12_kept_tokens_sql),
    ("013_alert_episodes.sql", PackageResources._13_alert_episodes_sql),
    ("014_queue_gate.sql", PackageResources._14_queue_gate_sql),
    ("015_definer_hardening.sql", PackageResources._15_definer_hardening_sql),
    ("016_apple_tokens.sql", PackageResources._16_apple_tokens_sql),
    ("017_transfers.sql", PackageResources._17_transfers_sql),
    ("018_transfer_deadline.sql", PackageResources._18_transfer_deadline_sql),
    ("019_endpoint_alerts.sql", PackageResources._19_endpoint_alerts_sql),
    ("020_endpoint_checks.sql", PackageResources._20_endpoint_checks_sql),
    ("021_open_effects_index.sql", PackageResources._21_open_effects_index_sql),
    ("022_notifications_half_pages.sql", PackageResources._22_notifications_half_pages_sql),
    ("023_erasure_leaves_transfers.sql", PackageResources._23_erasure_leaves_transfers_sql),
    ("024_lanes_by_subject.sql", PackageResources._24_lanes_by_subject_sql),
    ("025_caches_without_credentials.sql", PackageResources._25_caches_without_credentials_sql),
    ("026_alert_kinds_by_name.sql", PackageResources._26_alert_kinds_by_name_sql),
    ("027_notification_status_follows_jobs.sql", PackageResources._27_notification_status_follows_jobs_sql),
    ("028_apple_validations_lane.sql", PackageResources._28_apple_validations_lane_sql),
    ("029_suppressions.sql", PackageResources._29_suppressions_sql),
]

/// A numbered SQL migration from `sql/` (built into the binary, so it runs from any directory).
package struct Migration: Sendable {
    package let version: Int
    package let name: String
    package let sql: String
    package init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
    }

    package var checksum: String { SHA256.hash(data: Data(sql.utf8)).map { String(format: "%02x", $0) }.joined() }

    /// Every migration in `sql/`, in order. File names are `NNN_name.sql`.
    package static let all: [Migration] = {
        embedded.map { file, bytes in
            let digits = file.prefix(while: \.isNumber)
            let name = file.dropFirst(digits.count + 1).replacingOccurrences(of: ".sql", with: "")
            return Migration(version: Int(digits)!, name: name, sql: String(decoding: bytes, as: UTF8.self))
        }.sorted { $0.version < $1.version }
    }()
}

package enum MigrationError: Error, CustomStringConvertible {
    case edited(version: Int, name: String)
    case unknownApplied(version: Int)
    case behind(pending: [String])
    case failed(version: Int, name: String, underlying: String)

    package var description: String {
        switch self {
        case .edited(let version, let name):
            "migration \(version)_\(name).sql was edited after it was applied (checksum differs); add a new numbered migration instead of changing an applied one"
        case .unknownApplied(let version):
            "the database has migration \(version) applied, which this binary does not know; run a newer siwa-events against this database"
        case .behind(let pending):
            "the database schema is behind (pending: \(pending.joined(separator: ", "))); run `siwa-events migrate` or start with SIWA_MIGRATE_ON_START=true"
        case .failed(let version, let name, let underlying):
            "migration \(version)_\(name).sql failed and was rolled back: \(underlying)"
        }
    }
}

/// Applies `sql/` migrations in order, each in its own transaction, under an advisory lock (so
/// several instances starting at once are safe), recording each with its checksum.
package struct Migrator: Sendable {
    /// Arbitrary, fixed: the advisory lock key of siwa-events migrations.
    static let lockKey: Int64 = 0x5157_4D49_4752
    let client: PostgresClient
    let migrations: [Migration]
    let logger: Logger

    package init(client: PostgresClient, migrations: [Migration] = Migration.all, logger: Logger) {
        self.client = client
        self.migrations = migrations
        self.logger = logger
    }

    /// Applies what is pending; returns the versions applied.
    @discardableResult
    package func migrate() async throws -> [Int] {
        try await client.withConnection { connection in
            // Rows read to the end: a row-returning statement's error arrives with its rows.
            for try await _ in try await connection.query("SELECT pg_advisory_lock(\(Self.lockKey))", logger: logger) {}
            do {
                let applied = try await self.migrateLocked(connection)
                for try await _ in try await connection.query("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger) {}
                return applied
            } catch {
                _ = try? await connection.query("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger)
                throw error
            }
        }
    }

    /// Throws `MigrationError.behind` when migrations are pending (for SIWA_MIGRATE_ON_START=false).
    package func checkUpToDate() async throws {
        let pending = try await client.withConnection { try await self.pending($0) }
        if !pending.isEmpty {
            throw MigrationError.behind(pending: pending.map { "\($0.version)_\($0.name)" })
        }
    }

    private func pending(_ connection: PostgresConnection) async throws -> [Migration] {
        try await connection.query(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())
            """, logger: logger)
        var applied: [Int: String] = [:]
        for try await (version, checksum) in try await connection.query(
            "SELECT version, checksum FROM schema_migrations", logger: logger
        ).decode((Int, String).self) {
            applied[version] = checksum
        }
        let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
        if let unknown = applied.keys.sorted().first(where: { known[$0] == nil }) {
            throw MigrationError.unknownApplied(version: unknown)
        }
        for migration in migrations {
            if let checksum = applied[migration.version], checksum != migration.checksum {
                throw MigrationError.edited(version: migration.version, name: migration.name)
            }
        }
        return migrations.filter { applied[$0.version] == nil }
    }

    private func migrateLocked(_ connection: PostgresConnection) async throws -> [Int] {
        var done: [Int] = []
        for migration in try await pending(connection) {
            do {
                try await connection.query("BEGIN", logger: logger)
                for statement in SQLStatements.split(migration.sql) {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (\(migration.version), \(migration.name), \(migration.checksum))",
                    logger: logger)
                try await connection.query("COMMIT", logger: logger)
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw MigrationError.failed(version: migration.version, name: migration.name, underlying: String(reflecting: error))
            }
            logger.info("migration applied", metadata: ["version": "\(migration.version)", "name": "\(migration.name)"])
            done.append(migration.version)
        }
        return done
    }
}
