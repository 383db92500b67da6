import Foundation
import Logging
import PostgresNIO
import SiwaDomain

/// A user's refresh token as the store keeps it: already encrypted (`AppleTokenCipher`).
package struct KeptAppleToken: Sendable {
    package var clientID: String
    /// `v1.<key id>.<base64url>`, bound to the account's aud/sub.
    package var ciphertext: String
    /// `AppleAuthRecord.fingerprint` of the clear token.
    package var fingerprint: String

    package init(clientID: String, ciphertext: String, fingerprint: String) {
        self.clientID = clientID
        self.ciphertext = ciphertext
        self.fingerprint = fingerprint
    }
}

/// What an applied `consent-revoked` or `account-delete` does with the user's kept tokens.
package enum KeptTokensOnAppleEvent: Sendable {
    /// Delete them: Apple has ended them already (the default).
    case forget
    /// Queue them for `/auth/revoke` all the same (`SIWA_APPLE_REVOKE_ON_EVENTS`).
    case revoke
}

/// A stored ciphertext (a kept token, or a revocation job's payload) and whose it is.
package struct StoredCiphertext: Sendable {
    package enum Place: Sendable { case keptToken(clientID: String), revocationJob(id: Int) }
    package var place: Place
    package var owner: AppleTokenOwner
    package var ciphertext: String
}

/// Apple's tokens at rest (`apple_tokens`), their way into the revocation lane, and the record of
/// every call to Apple's auth endpoints (`apple_auth_calls`): every statement. Encryption happens
/// before a token reaches the store; nothing here sees a clear token.
package struct AppleTokenStore: AppleCallRecorder {
    package let client: PostgresClient
    let logger: Logger

    package init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    // MARK: Keep

    /// Keeps `token` as the user's refresh token for its client ID, replacing an older one, in the
    /// caller's transaction (the one that opens the session).
    static func keep(_ token: KeptAppleToken, aud: String, sub: String, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            INSERT INTO apple_tokens (aud, sub, client_id, token, fingerprint)
            VALUES (\(aud), \(sub), \(token.clientID), \(token.ciphertext), \(token.fingerprint))
            ON CONFLICT (aud, sub, client_id) DO UPDATE SET token = excluded.token, fingerprint = excluded.fingerprint,
                updated_at = now(), validated_at = NULL
            """, logger: logger)
    }

    // MARK: Revoke, Forget

    /// A user whose kept tokens go, and which: those kept at or before `cutoff` (nil: all of them).
    /// A revoking event's cutoff is its event time, as for sessions: a sign-in after it is new
    /// consent, and its token stays (a late `consent-revoked` must not lose it unrevoked).
    package struct TokenCutoff: Sendable, Hashable {
        package var aud: String
        package var sub: String
        package var cutoff: Date?

        package init(aud: String, sub: String, cutoff: Date? = nil) {
            self.aud = aud
            self.sub = sub
            self.cutoff = cutoff
        }
    }

    /// Moves each of the users' stored tokens (kept at or before their cutoff) into a revocation
    /// job (ciphertext as payload) and deletes it, in the caller's transaction: the token leaves
    /// with the account, yet is never lost before Apple has taken the revocation. Tells revocation
    /// deliverers at commit. Returns the jobs enqueued.
    @discardableResult
    static func enqueueRevocations(of users: [TokenCutoff], on connection: PostgresConnection, logger: Logger) async throws -> Int {
        guard !users.isEmpty else { return 0 }
        var count = 0
        for try await (n, _) in try await connection.query(
            """
            WITH taken AS (
                DELETE FROM apple_tokens t
                USING unnest(\(users.map(\.aud))::text[], \(users.map(\.sub))::text[], \(NullableArray(users.map(\.cutoff)))::timestamptz[]) AS u(aud, sub, cutoff)
                WHERE t.aud = u.aud AND t.sub = u.sub AND (u.cutoff IS NULL OR t.updated_at <= u.cutoff)
                RETURNING t.aud, t.sub, t.client_id, t.token
            ), queued AS (
                \(unescaped: JobQueue.enqueueAppleRevocationsSQL(from: "taken"))
            )
            SELECT (SELECT count(*) FROM queued)::bigint, \(unescaped: JobQueue.notifySQL(.appleRevocations, ifAnyIn: "queued"))::bigint
            """, logger: logger
        ).decode((Int, Int).self) {
            count = n
        }
        return count
    }

    /// The body of a data-modifying CTE that deletes, without revoking them (Apple has ended them:
    /// `account-delete`, `consent-revoked`), the kept tokens of the users `users` selects (columns
    /// `aud`, `sub`, `cutoff`: those kept at or before it, or all when it is NULL): the effect
    /// batch runs it inside its session revocation, one round trip.
    static func forgetSQL(users: String) -> String {
        "DELETE FROM apple_tokens t USING (\(users)) u WHERE t.aud = u.aud AND t.sub = u.sub AND (u.cutoff IS NULL OR t.updated_at <= u.cutoff)"
    }

    // MARK: Calls

    /// Records one call to Apple's auth endpoints (what was sent, what came back): the gateway's
    /// recorder. Returns the record's id.
    @discardableResult
    package func record(_ call: AppleAuthRecord, about subject: AppleCallSubject) async throws -> Int {
        var id = 0
        for try await (recorded,) in try await client.bounded.query(
            """
            INSERT INTO apple_auth_calls (endpoint, client_id, grant_type, token_type_hint, token_fingerprint, status, error, aud, sub, job_id)
            VALUES (\(call.endpoint.rawValue), \(call.clientID), \(call.grantType?.rawValue), \(call.tokenTypeHint?.rawValue), \(call.tokenFingerprint),
                \(call.status), \(call.error.map { $0.word ?? "unrecognised" }), \(subject.aud), \(subject.sub), \(subject.jobID))
            RETURNING id
            """, logger: logger
        ).decode((Int,).self) {
            id = recorded
        }
        return id
    }

    /// A sign-in's code exchange, recorded with no user, belongs to the user it signed in: in the
    /// sign-in's transaction, so it shows in their timeline exactly when the sign-in committed.
    static func attribute(call id: Int, aud: String, sub: String, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query("UPDATE apple_auth_calls SET aud = \(aud), sub = \(sub) WHERE id = \(id) AND aud IS NULL", logger: logger)
    }

    /// A recorded call, newest first in `calls`.
    package struct Call: Sendable {
        package var id: Int
        package var at: Date
        package var record: AppleAuthRecord
        package var aud: String?
        package var sub: String?
        package var jobID: Int?

        /// As the timeline and `apple calls --json` show it: a fingerprint, never a token.
        package var json: JSONValue {
            .object([
                "id": .number(Double(id)), "at": .string(iso8601(at)), "endpoint": .string(record.endpoint.rawValue),
                "client_id": .string(record.clientID), "grant_type": record.grantType.map { .string($0.rawValue) } ?? .null,
                "token_type_hint": record.tokenTypeHint.map { .string($0.rawValue) } ?? .null,
                "token_fingerprint": .string(record.tokenFingerprint), "status": record.status.map { .number(Double($0)) } ?? .null,
                "error": record.error.map { .string($0.word ?? "unrecognised") } ?? .null,
                "aud": aud.map(JSONValue.string) ?? .null, "sub": sub.map(JSONValue.string) ?? .null,
                "job_id": jobID.map { .number(Double($0)) } ?? .null,
            ])
        }
    }

    /// The calls recorded for a user (`aud`/`sub`), or for a revocation job, newest first.
    package func calls(aud: String? = nil, sub: String? = nil, jobID: Int? = nil, limit: Int = 100) async throws -> [Call] {
        var calls: [Call] = []
        for try await row in try await client.bounded.query(
            """
            SELECT id, at, endpoint, client_id, grant_type, token_type_hint, token_fingerprint, status, error, aud, sub, job_id
            FROM apple_auth_calls
            WHERE (\(aud)::text IS NULL OR (aud = \(aud) AND sub = \(sub))) AND (\(jobID)::bigint IS NULL OR job_id = \(jobID))
            ORDER BY at DESC, id DESC LIMIT \(max(1, min(limit, 10_000)))
            """, logger: logger
        ).decode((Int, Date, String, String, String?, String?, String, Int?, String?, String?, String?, Int?).self) {
            guard let endpoint = AppleAuthEndpoint(rawValue: row.2) else { continue }
            var record = AppleAuthRecord(
                endpoint: endpoint, clientID: row.3, grantType: row.4.flatMap(AppleGrantType.init(rawValue:)),
                tokenTypeHint: row.5.flatMap(AppleTokenKind.init(rawValue:)), tokenFingerprint: row.6, status: row.7)
            record.error = row.8.map { AppleAuthError(word: $0) ?? .unrecognised(status: row.7 ?? 0) }
            calls.append(Call(id: row.0, at: row.1, record: record, aud: row.9, sub: row.10, jobID: row.11))
        }
        return calls
    }

    /// Deletes up to `limit` call records older than `retention` (the history's), oldest first.
    package func pruneCalls(retention: Duration, limit: Int = 1000) async throws -> Int {
        return try await client.bounded.count(
            """
            WITH pruned AS (
                DELETE FROM apple_auth_calls WHERE id IN (
                    SELECT id FROM apple_auth_calls WHERE at < now() - \(Int(retention.components.seconds)) * interval '1 second'
                    ORDER BY at LIMIT \(limit))
                RETURNING id
            )
            SELECT count(*)::bigint FROM pruned
            """, logger: logger)
    }

    // MARK: Validation

    /// A kept token claimed for validation.
    package struct DueToken: Sendable {
        package var owner: AppleTokenOwner
        package var clientID: String
        package var ciphertext: String
        /// The clear token's fingerprint: the same across a re-seal, another for a new token.
        package var fingerprint: String
    }

    /// Claims up to `limit` tokens last validated (or kept) at or before `dueBefore`, oldest
    /// first, by setting their `validated_at` to `mark` (the scheduler's next round skips them; a
    /// token whose job is lost is due again at `mark`'s turn). Their jobs go on the
    /// `apple_validations` lane.
    package func claimDue(dueBefore: Date, mark: Date, limit: Int) async throws -> [DueToken] {
        var due: [DueToken] = []
        for try await row in try await client.bounded.query(
            """
            WITH due AS (
                SELECT aud, sub, client_id FROM apple_tokens
                WHERE coalesce(validated_at, created_at) <= \(dueBefore)
                ORDER BY coalesce(validated_at, created_at)
                LIMIT \(limit)
                FOR UPDATE SKIP LOCKED
            )
            UPDATE apple_tokens t SET validated_at = \(mark)
            FROM due WHERE t.aud = due.aud AND t.sub = due.sub AND t.client_id = due.client_id
            RETURNING t.aud, t.sub, t.client_id, t.token, t.fingerprint
            """, logger: logger
        ).decode((String, String, String, String, String).self) {
            due.append(DueToken(owner: AppleTokenOwner(aud: row.0, sub: row.1), clientID: row.2, ciphertext: row.3, fingerprint: row.4))
        }
        return due
    }

    /// The token kept for `owner` and `clientID` now (nil: deleted since).
    package func kept(_ owner: AppleTokenOwner, clientID: String) async throws -> DueToken? {
        for try await (ciphertext, fingerprint) in try await client.bounded.query(
            "SELECT token, fingerprint FROM apple_tokens WHERE aud = \(owner.aud) AND sub = \(owner.sub) AND client_id = \(clientID)", logger: logger
        ).decode((String, String).self) {
            return DueToken(owner: owner, clientID: clientID, ciphertext: ciphertext, fingerprint: fingerprint)
        }
        return nil
    }

    /// Apple accepted `token`: validated at `now`, unless a sign-in replaced it meanwhile.
    package func markValid(_ token: DueToken, at now: Date) async throws {
        try await client.bounded.query(
            """
            UPDATE apple_tokens SET validated_at = \(now)
            WHERE aud = \(token.owner.aud) AND sub = \(token.owner.sub) AND client_id = \(token.clientID) AND token = \(token.ciphertext)
            """, logger: logger)
    }

    /// Apple answered `invalid_grant` for `token`: the user revoked us outside any notification we
    /// saw (the gateway recorded the call). Treated like `consent-revoked`, in one transaction: the dead token
    /// dropped, consent marked revoked at `now` (a new session needs a new sign-in) and the user's
    /// active sessions revoked (`consent-revoked`, by `apple-token-validation`). Returns how many.
    package func consentLost(_ token: DueToken, at now: Date) async throws -> Int {
        let logger = self.logger
        return try await client.bounded.transaction(logger: logger) { connection in
            let (aud, sub) = (token.owner.aud, token.owner.sub)
            try await connection.query(
                "DELETE FROM apple_tokens WHERE aud = \(aud) AND sub = \(sub) AND client_id = \(token.clientID) AND token = \(token.ciphertext)",
                logger: logger)
            try await connection.query(
                """
                UPDATE accounts SET consent_revoked_at = greatest(coalesce(consent_revoked_at, '-infinity'), \(now)), updated_at = now()
                WHERE aud = \(aud) AND sub = \(sub)
                """, logger: logger)
            var revoked = 0
            for try await (n,) in try await connection.query(
                """
                WITH revoked AS (
                    UPDATE sessions SET revoked_at = now(), revoked_reason = \(EventType.consentRevoked.rawValue), revoked_by = 'apple-token-validation',
                        revoked_event_time = \(now)
                    WHERE aud = \(aud) AND sub = \(sub) AND revoked_at IS NULL
                    RETURNING 1
                )
                SELECT count(*)::bigint FROM revoked
                """, logger: logger
            ).decode((Int,).self) {
                revoked = n
            }
            return revoked
        }
    }

    // MARK: Keys

    /// How many stored ciphertexts (kept tokens and pending revocations) each key id encrypts.
    package func ciphertextsByKey() async throws -> [String: Int] {
        var counts = try await JobQueue(client: client, logger: logger).appleRevocationPayloadsByKey()
        for try await (key, n) in try await client.bounded.query(
            "SELECT key_id, count(*)::bigint FROM apple_tokens GROUP BY 1", logger: logger
        ).decode((String, Int).self) {
            counts[key, default: 0] += n
        }
        return counts
    }

    /// Up to `limit` stored ciphertexts of each place (kept tokens, pending revocations) under a
    /// key other than `currentKeyID`.
    package func ciphertexts(notUnder currentKeyID: String, limit: Int) async throws -> [StoredCiphertext] {
        var found: [StoredCiphertext] = []
        for try await row in try await client.bounded.query(
            "SELECT aud, sub, client_id, token FROM apple_tokens WHERE key_id <> \(currentKeyID) LIMIT \(limit)", logger: logger
        ).decode((String, String, String, String).self) {
            found.append(StoredCiphertext(place: .keptToken(clientID: row.2), owner: AppleTokenOwner(aud: row.0, sub: row.1), ciphertext: row.3))
        }
        let queue = JobQueue(client: client, logger: logger)
        for job in try await queue.appleRevocationPayloads(notUnder: currentKeyID, limit: limit) {
            found.append(StoredCiphertext(place: .revocationJob(id: job.id), owner: job.owner, ciphertext: job.ciphertext))
        }
        return found
    }

    /// Replaces `stored` with `replacement` if it is still what is stored (a sign-in or a
    /// completed revocation in between wins). Returns whether it was replaced.
    package func replace(_ stored: StoredCiphertext, with replacement: String) async throws -> Bool {
        switch stored.place {
        case .revocationJob(let id):
            return try await JobQueue(client: client, logger: logger).replaceAppleRevocationPayload(id: id, stored.ciphertext, with: replacement)
        case .keptToken(let clientID):
            var replaced = false
            for try await (n,) in try await client.bounded.query(
                """
                WITH r AS (UPDATE apple_tokens SET token = \(replacement)
                           WHERE aud = \(stored.owner.aud) AND sub = \(stored.owner.sub) AND client_id = \(clientID) AND token = \(stored.ciphertext)
                           RETURNING 1)
                SELECT count(*)::bigint FROM r
                """, logger: logger
            ).decode((Int,).self) {
                replaced = n > 0
            }
            return replaced
        }
    }

    /// Records a finished re-encryption in the audit log.
    package func auditReencryption(actor: String, keyID: String, reencrypted: Int) async throws {
        try await client.bounded.query(
            """
            INSERT INTO audit_log (actor, action, target, details)
            VALUES (\(actor), 'apple_tokens.reencrypt', \(keyID), jsonb_build_object('reencrypted', \(reencrypted)::bigint))
            """, logger: logger)
    }
}
