import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A token that authenticated a request.
package struct TokenIdentity: Sendable, Equatable {
    package var id: String
    package var name: String
    package var scopes: Set<APIScope>
}

package struct TokenSummary: Sendable {
    package var id: String
    package var name: String
    package var scopes: [String]
    package var createdAt: Date
    package var expiresAt: Date?
    package var lastUsedAt: Date?
    package var revokedAt: Date?
}

package struct AuditEntry: Sendable {
    package var id: Int
    package var at: Date
    package var actor: String
    package var action: String
    package var target: String
    package var details: String
}

package enum TokenStoreError: Error, Sendable, CustomStringConvertible {
    case nameTaken(String)

    package var description: String {
        switch self {
        case .nameTaken(let name): "a live token is already named \(name): revoke it first (`siwa-events tokens revoke \(name)`) or choose another name"
        }
    }
}

/// API tokens (hashes only) and the audit log: every statement.
package struct TokenStore: Sendable {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: TokensCreate

    /// Creates a token and records it in the audit log (one statement). Returns its id and the
    /// token, which exists nowhere else from now on.
    package func create(name: String, scopes: [APIScope], expiresAt: Date?, actor: String) async throws -> (id: String, token: String) {
        let token = APIToken.generate()
        let hash = Data(APIToken.hash(token)!)
        let scopeNames = scopes.map(\.rawValue)
        do {
            for try await (id,) in try await client.bounded.query(
                """
                WITH created AS (
                    INSERT INTO api_tokens (name, token_hash, scopes, expires_at)
                    VALUES (\(name), \(hash), \(scopeNames), \(expiresAt))
                    RETURNING id, name, scopes, expires_at
                ), audited AS (
                    INSERT INTO audit_log (actor, action, target, details)
                    SELECT \(actor), 'token.create', name, jsonb_build_object('id', id, 'scopes', scopes, 'expires_at', expires_at) FROM created
                )
                SELECT id::text FROM created
                """, logger: logger
            ).decode((String,).self) {
                return (id, token)
            }
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == "23505" {
            throw TokenStoreError.nameTaken(name)
        }
        throw TokenStoreError.nameTaken(name)
    }

    // MARK: TokensAuthenticate

    /// The live token with this value, or nil (unknown, malformed, expired or revoked: the caller
    /// answers 401 alike). Marks it used, at most once a minute.
    package func authenticate(_ token: String) async throws -> TokenIdentity? {
        guard let hash = APIToken.hash(token).map({ Data($0) }) else { return nil }
        for try await (id, name, scopes) in try await client.bounded.query(
            """
            WITH live AS (
                SELECT id, name, scopes, last_used_at FROM api_tokens
                WHERE token_hash = \(hash) AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
            ), touched AS (
                UPDATE api_tokens t SET last_used_at = now() FROM live
                WHERE t.id = live.id AND (live.last_used_at IS NULL OR live.last_used_at < now() - interval '1 minute')
            )
            SELECT id::text, name, scopes FROM live
            """, logger: logger
        ).decode((String, String, [String]).self) {
            return TokenIdentity(id: id, name: name, scopes: Set(scopes.compactMap(APIScope.init(rawValue:))))
        }
        return nil
    }

    // MARK: TokensList, TokensRevoke

    package func list(includeRevoked: Bool) async throws -> [TokenSummary] {
        var tokens: [TokenSummary] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id::text, name, scopes, created_at, expires_at, last_used_at, revoked_at FROM api_tokens
            WHERE \(includeRevoked) OR revoked_at IS NULL
            ORDER BY created_at DESC, id
            """, logger: logger
        ).decode((String, String, [String], Date, Date?, Date?, Date?).self) {
            tokens.append(TokenSummary(id: row.0, name: row.1, scopes: row.2, createdAt: row.3, expiresAt: row.4, lastUsedAt: row.5, revokedAt: row.6))
        }
        return tokens
    }

    /// Revokes the live token with this name or id. Returns its name, or nil when none matched.
    package func revoke(_ nameOrID: String, actor: String) async throws -> String? {
        let id = UUID(uuidString: nameOrID)
        for try await (name,) in try await client.bounded.query(
            """
            WITH revoked AS (
                UPDATE api_tokens SET revoked_at = now()
                WHERE revoked_at IS NULL AND (name = \(nameOrID) OR (\(id)::uuid IS NOT NULL AND id = \(id)))
                RETURNING id, name
            ), audited AS (
                INSERT INTO audit_log (actor, action, target, details)
                SELECT \(actor), 'token.revoke', name, jsonb_build_object('id', id) FROM revoked
            )
            SELECT name FROM revoked
            """, logger: logger
        ).decode((String,).self) {
            return name
        }
        return nil
    }

    // MARK: AuditList

    package func audit(limit: Int) async throws -> [AuditEntry] {
        var entries: [AuditEntry] = []
        for try await row in try await client.bounded.query(
            "SELECT id, at, actor, action, target, details::text FROM audit_log ORDER BY at DESC, id DESC LIMIT \(max(1, min(limit, 10_000)))",
            logger: logger
        ).decode((Int, Date, String, String, String, String).self) {
            entries.append(AuditEntry(id: row.0, at: row.1, actor: row.2, action: row.3, target: row.4, details: row.5))
        }
        return entries
    }
}
