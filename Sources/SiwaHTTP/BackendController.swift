import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import SiwaApple
import SiwaDomain
import SiwaStore

/// The backend API's sessions and accounts (`/v1`, behind `BearerAuthMiddleware`).
package struct BackendController: Sendable {
    package struct Settings: Sendable {
        /// Bundle IDs: the `aud` of accounts (Apple's notifications use them).
        package var bundleIDs: Set<String>
        /// Client IDs accepted in identity tokens → the bundle ID whose accounts they sign in to.
        package var clientIDs: [String: String]
        package var sessionTTL: Duration
        package var clockSkew: Duration
        package var databaseTimeout: Duration

        package init(bundleIDs: Set<String>, clientIDs: [String: String], sessionTTL: Duration, clockSkew: Duration, databaseTimeout: Duration) {
            self.bundleIDs = bundleIDs
            self.clientIDs = clientIDs
            self.sessionTTL = sessionTTL
            self.clockSkew = clockSkew
            self.databaseTimeout = databaseTimeout
        }
    }

    static let maximumBodySize = 64 * 1024

    let accounts: AccountStore
    let keys: AppleKeyCache
    let settings: Settings
    let verifier: IdentityTokenVerifier
    /// Sign-in completion by authorization code (nil: no Apple credentials configured).
    let appleSignIn: AppleSignIn?
    /// The time identity tokens are checked at (tests verify real, long-expired tokens at theirs).
    let clock: @Sendable () -> Date

    package init(
        accounts: AccountStore, keys: AppleKeyCache, settings: Settings, appleSignIn: AppleSignIn? = nil, clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.accounts = accounts
        self.keys = keys
        self.settings = settings
        self.appleSignIn = appleSignIn
        self.clock = clock
        self.verifier = IdentityTokenVerifier(clientIDs: Set(settings.clientIDs.keys), clockSkew: settings.clockSkew)
    }

    package func register(on group: RouterGroup<SiwaRequestContext>) {
        group.post("sessions", use: createSession)
        group.get("sessions/:id", use: getSession)
        group.delete("sessions/:id", use: logout)
        group.get("accounts/:aud/:sub", use: getAccount)
        group.get("accounts/:aud/:sub/sessions", use: listSessions)
        group.delete("accounts/:aud/:sub", use: erase)
    }

    // MARK: Sessions

    @Sendable func createSession(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.sessionsWrite)
        let body = try await JSONBody.object(request, limit: Self.maximumBodySize)
        let now = clock()
        let expiresAt: Date
        if let value = body["expires_at"] {
            guard let date = JSONBody.date(value) else {
                throw APIError.invalid("expires_at must be an ISO-8601 time like 2026-12-31T23:59:59Z")
            }
            guard date > now else { throw APIError.invalid("expires_at must be in the future") }
            expiresAt = date
        } else {
            expiresAt = now.addingTimeInterval(settings.sessionTTL.timeInterval)
        }

        let aud: String
        let sub: String
        var identity: VerifiedIdentity?
        var kept: (token: KeptAppleToken, exchange: AppleAuthRecord, refreshToken: String, signIn: AppleSignIn)?
        if body["identity_token"] != nil || body["authorization_code"] != nil {
            let signIn: AppleSignIn?
            if body["authorization_code"] != nil {
                try JSONBody.allowOnly(
                    ["authorization_code", "redirect_uri", "client_id", "identity_token", "nonce", "expires_at"], in: body,
                    hint: "with authorization_code, aud and sub come from Apple's id_token")
                guard let appleSignIn else { throw AppleSignIn.notConfigured }
                signIn = appleSignIn
            } else {
                try JSONBody.allowOnly(["identity_token", "nonce", "expires_at"], in: body, hint: "with identity_token, aud and sub come from the token")
                signIn = nil
            }
            let nonce: String?
            switch body["nonce"] {
            case nil, .null?: nonce = nil
            case .string(let text)? where !text.isEmpty && text.utf8.count <= 512: nonce = text
            default: throw APIError.invalid("nonce must be the raw nonce string your app generated (1-512 characters)")
            }
            var sent: VerifiedIdentity?
            if body["identity_token"] != nil {
                guard let token = body["identity_token"]?.stringValue, !token.isEmpty else {
                    throw APIError.invalid("identity_token must be a string: the id_token Apple returned to your app")
                }
                sent = try await verifyIdentity(token, nonce: nonce, now: now)
            }
            if let signIn {
                // The nonce is checked on the identity token sent, else on the grant's id_token.
                let completed = try await complete(
                    body, identity: sent, nonce: sent == nil ? nonce : nil, with: signIn, now: now, logger: context.logger)
                identity = completed.identity
                kept = (completed.token, completed.exchange, completed.refreshToken, signIn)
            } else {
                identity = sent
            }
            guard let verified = identity, let bundleID = settings.clientIDs[verified.clientID] else {
                throw APIError.invalid("client ID \(identity?.clientID ?? "") has no bundle ID (SIWA_APPLE_CLIENT_IDS)")
            }
            aud = bundleID
            sub = verified.sub
        } else {
            try JSONBody.allowOnly(["aud", "sub", "expires_at"], in: body, hint: "send identity_token, authorization_code, or aud and sub")
            aud = try JSONBody.string(body, "aud", hint: "your app's bundle ID")
            sub = try JSONBody.string(body, "sub", hint: "Apple's user identifier")
            guard settings.bundleIDs.contains(aud) else {
                throw APIError.invalid("aud \(aud) is not one of SIWA_APPLE_BUNDLE_IDS (\(settings.bundleIDs.sorted().joined(separator: ", ")))")
            }
        }
        do {
            let session = try await accounts.createSession(
                aud: aud, sub: sub, expiresAt: expiresAt, identity: identity, appleToken: kept?.token, exchange: kept?.exchange)
            return .json(Self.json(session), status: .created)
        } catch AccountStoreError.accountDeleted(let message) {
            if let kept { await discard(kept.refreshToken, clientID: kept.token.clientID, with: kept.signIn, logger: context.logger) }
            throw APIError(.conflict, code: "conflict", message: message, reason: "account_deleted")
        } catch AccountStoreError.consentRevoked(let message) {
            if let kept { await discard(kept.refreshToken, clientID: kept.token.clientID, with: kept.signIn, logger: context.logger) }
            throw APIError(.conflict, code: "conflict", message: message, reason: "consent_revoked")
        }
    }

    /// Sign-in completion: the body's code exchanged at Apple, its id_token checked against the
    /// identity token sent with it (`identity`) or against `nonce`, the refresh token encrypted for
    /// the account. Returns the identity the account takes (the one sent, else the grant's).
    private func complete(
        _ body: [String: JSONValue], identity sent: VerifiedIdentity?, nonce: String?, with signIn: AppleSignIn, now: Date, logger: Logger
    ) async throws -> (identity: VerifiedIdentity, token: KeptAppleToken, exchange: AppleAuthRecord, refreshToken: String) {
        let code = try Self.opaque(body, "authorization_code", hint: "the code Apple returned to your app with the identity token")
        let redirectURI = body["redirect_uri"] == nil || body["redirect_uri"] == .null
            ? nil : try Self.opaque(body, "redirect_uri", hint: "the redirect_uri of your web sign-in, exactly as sent to Apple")
        let clientID = try resolveClientID(body, identity: sent)
        let exchanged = try await exchange(
            code: code, clientID: clientID, redirectURI: redirectURI, nonce: nonce, with: signIn, now: now, logger: logger)
        if let sent, sent.sub != exchanged.identity.sub {
            logger.notice("code exchange for another user than the identity token", metadata: ["apple_call": "\(exchanged.record)"])
            await discard(exchanged.refreshToken, clientID: clientID, with: signIn, logger: logger)
            throw APIError(
                .unauthorized, code: "invalid_token",
                message: "the authorization code signs in another user than identity_token (its id_token has another sub); no session was opened",
                reason: AppleSignIn.Reason.subMismatch.rawValue)
        }
        let identity = sent ?? exchanged.identity
        guard let bundleID = settings.clientIDs[clientID] else {
            throw APIError.invalid("client ID \(clientID) has no bundle ID (SIWA_APPLE_CLIENT_IDS)")
        }
        let owner = AppleTokenOwner(aud: bundleID, sub: identity.sub)
        let token = KeptAppleToken(
            clientID: clientID, ciphertext: signIn.cipher.encrypt(exchanged.refreshToken, owner: owner),
            fingerprint: AppleAuthRecord.fingerprint(exchanged.refreshToken))
        return (identity, token, exchanged.record, exchanged.refreshToken)
    }

    /// Revokes the refresh token of a sign-in that failed after Apple granted it (another user
    /// than the identity token, an id_token that does not verify, an account that may not sign in):
    /// nobody keeps it, so nothing else ever would. Recorded like every call to Apple; the
    /// request fails either way.
    private func discard(_ refreshToken: String, clientID: String, with signIn: AppleSignIn, logger: Logger) async {
        let call = await signIn.client.revoke(token: refreshToken, hint: .refreshToken, clientID: clientID)
        if case .failure(let failure) = call.result {
            logger.warning("the refresh token of a failed sign-in could not be revoked", metadata: ["apple_call": "\(call.record)", "failure": "\(failure)"])
        }
        guard call.record.status != nil else { return }
        do {
            try await AppleTokenStore(client: accounts.client, logger: logger).record(call.record, aud: nil, sub: nil)
        } catch {
            logger.warning("the revocation of a failed sign-in's refresh token could not be recorded", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// The client ID a code was issued to: the identity token's `aud` when one is sent (`client_id`,
    /// if given too, must be the same), else `client_id`, else the only configured one.
    private func resolveClientID(_ body: [String: JSONValue], identity: VerifiedIdentity?) throws -> String {
        let given = body["client_id"] == nil || body["client_id"] == .null
            ? nil : try JSONBody.string(body, "client_id", hint: "the client ID (bundle ID or Services ID) the code was issued to")
        if let identity {
            if let given, given != identity.clientID {
                throw APIError.invalid("client_id \(given) is not the identity token's aud (\(identity.clientID)): leave client_id out")
            }
            return identity.clientID
        }
        let configured = settings.clientIDs.keys.sorted()
        if let given {
            guard settings.clientIDs[given] != nil else {
                throw APIError.invalid("client_id \(given) is not one of SIWA_APPLE_CLIENT_IDS (\(configured.joined(separator: ", ")))")
            }
            return given
        }
        guard configured.count == 1 else {
            throw APIError.invalid(
                "client_id is required with authorization_code alone: \(configured.count) client IDs are configured (\(configured.joined(separator: ", "))); "
                    + "name the one the code was issued to")
        }
        return configured[0]
    }

    /// Exchanges `code` at Apple and verifies the id_token of the grant (same key cache and rules as
    /// identity tokens; `nonce` only when given). The code and tokens are never logged; a failure
    /// is logged with the call's record, which shows a fingerprint only.
    private func exchange(
        code: String, clientID: String, redirectURI: String?, nonce: String?, with signIn: AppleSignIn, now: Date, logger: Logger
    ) async throws -> (identity: VerifiedIdentity, refreshToken: String, record: AppleAuthRecord) {
        let call = await signIn.client.exchange(code: code, clientID: clientID, redirectURI: redirectURI)
        let grant: AppleTokenGrant
        switch call.result {
        case .failure(let failure):
            let error = AppleSignIn.error(for: failure, clientID: clientID)
            logger.log(
                level: error.status.code >= 500 ? .warning : .notice, "authorization code exchange failed",
                metadata: ["apple_call": "\(call.record)", "failure": "\(failure)"])
            // What Apple refused is on record (no user: none was verified); `invalid_client` there
            // fires the apple_credentials alert.
            if call.record.status != nil {
                do {
                    try await AppleTokenStore(client: accounts.client, logger: logger).record(call.record, aud: nil, sub: nil)
                } catch {
                    logger.warning("the refused code exchange could not be recorded", metadata: ["error": "\(loggable(error))"])
                }
            }
            throw error
        case .success(let value):
            grant = value
        }
        guard let refreshToken = grant.refreshToken, let idToken = grant.idToken else {
            logger.warning("code exchange granted without a refresh token or id_token", metadata: ["apple_call": "\(call.record)", "grant": "\(grant)"])
            throw APIError(
                .badGateway, code: "apple_error",
                message: "Apple's answer to the code exchange has no \(grant.refreshToken == nil ? "refresh_token" : "id_token"); no session was opened")
        }
        let identity: VerifiedIdentity
        do {
            identity = try await checkIdentity(idToken, nonce: nonce, now: now)
            guard identity.clientID == clientID else {
                throw APIError(.badGateway, code: "apple_error", message: "the id_token Apple returned is for client ID \(identity.clientID), not \(clientID)")
            }
        } catch let error as VerificationError where error.reason == .nonceMismatch {
            await discard(refreshToken, clientID: clientID, with: signIn, logger: logger)
            throw APIError(.unauthorized, code: "invalid_token", message: "the id_token of the code: \(error.message)", reason: error.reason.rawValue)
        } catch let error as VerificationError {
            logger.warning("the id_token of a code exchange does not verify", metadata: ["apple_call": "\(call.record)", "reason": "\(error.reason.rawValue)"])
            await discard(refreshToken, clientID: clientID, with: signIn, logger: logger)
            throw APIError(
                .badGateway, code: "apple_error", message: "the id_token Apple returned for the code does not verify: \(error.message)",
                reason: error.reason.rawValue)
        } catch {
            await discard(refreshToken, clientID: clientID, with: signIn, logger: logger)
            throw error
        }
        return (identity, refreshToken, call.record)
    }

    /// An opaque string field (a code, a URI): non-empty, at most 2048 bytes, without NUL.
    private static func opaque(_ body: [String: JSONValue], _ field: String, hint: String) throws -> String {
        guard let value = body[field]?.stringValue, !value.isEmpty, value.utf8.count <= 2048, !value.utf8.contains(0) else {
            throw APIError.invalid("\(field) must be a non-empty string of at most 2048 bytes: \(hint)")
        }
        return value
    }

    /// The same key cache and rules as the receiver: throws `VerificationError`, or a 503 when
    /// Apple's keys cannot be had.
    private func checkIdentity(_ token: String, nonce: String?, now: Date) async throws -> VerifiedIdentity {
        let jws = try CompactJWS(token)
        let kid = try NotificationVerifier.checkHeader(jws)
        switch await keys.resolve(kid: kid) {
        case .key(let key):
            return try verifier.verify(jws, key: key, nonce: nonce, now: now)
        case .unknown(let kid, _):
            throw VerificationError.invalid(.unknownKey, "no Apple key with kid \(kid), even after refreshing Apple's key set")
        case .unavailable(let retryAfter, _):
            throw APIError.unavailable("Apple's keys cannot be checked right now; retry later", retryAfter: retryAfter)
        }
    }

    /// An identity token the client sent: failures answer 401 `invalid_token` with the receiver's
    /// reason words.
    private func verifyIdentity(_ token: String, nonce: String?, now: Date) async throws -> VerifiedIdentity {
        do {
            return try await checkIdentity(token, nonce: nonce, now: now)
        } catch let error as VerificationError {
            switch error {
            case .malformed(let message):
                // Not a token Apple could have signed: as unacceptable as a bad signature.
                throw APIError(.unauthorized, code: "invalid_token", message: "identity_token: \(message)", reason: RejectionReason.malformedRequest.rawValue)
            case .invalid(let reason, let message):
                throw APIError(.unauthorized, code: "invalid_token", message: "identity_token: \(message)", reason: reason.rawValue)
            }
        }
    }

    @Sendable func getSession(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.sessionsRead)
        let id = try Self.sessionID(context)
        guard let session = try await accounts.session(id: id) else { throw APIError.notFound("no session \(id.uuidString.lowercased())") }
        return .json(Self.json(session))
    }

    @Sendable func logout(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.sessionsWrite)
        let id = try Self.sessionID(context)
        guard let session = try await accounts.logout(id: id) else { throw APIError.notFound("no session \(id.uuidString.lowercased())") }
        return .json(Self.json(session))
    }

    // MARK: Accounts

    @Sendable func getAccount(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.accountsRead)
        let (aud, sub) = try Self.user(context)
        guard let account = try await accounts.account(aud: aud, sub: sub) else {
            throw APIError.notFound("no account \(aud)/\(sub): nothing has been received or created for this user")
        }
        return .json(.object([
            "aud": .string(account.aud), "sub": .string(account.sub), "email": account.email.map(JSONValue.string) ?? .null,
            "is_private_email": account.isPrivateEmail.map(JSONValue.bool) ?? .null,
            "real_user_status": account.realUserStatus.map { .number(Double($0)) } ?? .null,
            "email_forwarding": account.emailForwarding.map(JSONValue.string) ?? .null,
            "consent_revoked_at": Self.time(account.consentRevokedAt), "consent_given_at": Self.time(account.consentGivenAt),
            "deleted_at": Self.time(account.deletedAt),
            "erased_at": Self.time(account.erasedAt), "created_at": .string(iso8601(account.createdAt)),
            "updated_at": .string(iso8601(account.updatedAt)),
        ]))
    }

    @Sendable func listSessions(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.sessionsRead)
        let (aud, sub) = try Self.user(context)
        let limit = try JSONBody.limit(request, default: 100, maximum: ListLimit.maximum)
        let after = try KeysetCursor.parameter(
            request, scope: "sessions", id: UUID.init(uuidString:), message: "cursor is not valid: pass back the next_cursor of the previous page")
        let rows = try await accounts.sessions(aud: aud, sub: sub, limit: limit + 1, after: after)
        let page = KeysetCursor.page(rows, limit: limit, scope: "sessions") { ($0.createdMicros, $0.id) }
        return .json(.object(["items": .array(page.items.map(Self.json)), "next_cursor": page.next]))
    }

    @Sendable func erase(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.accountsErase)
        let (aud, sub) = try Self.user(context)
        let erasure = try await accounts.erase(aud: aud, sub: sub, actor: context.actor)
        context.logger.notice(
            "account erased on request",
            metadata: ["aud": "\(aud)", "revoked_sessions": "\(erasure.revokedSessions)", "apple_revocations": "\(erasure.appleRevocations)"])
        return .json(.object([
            "aud": .string(aud), "sub": .string(sub), "erased_at": .string(iso8601(erasure.erasedAt)),
            "revoked_sessions": .number(Double(erasure.revokedSessions)), "apple_revocations": .number(Double(erasure.appleRevocations)),
        ]))
    }

    // MARK: Helpers

    static func json(_ session: Session) -> JSONValue {
        .object([
            "id": .string(session.id), "aud": .string(session.aud), "sub": .string(session.sub), "created_at": .string(iso8601(session.createdAt)),
            "expires_at": time(session.expiresAt), "active": .bool(session.active), "revoked_at": time(session.revokedAt),
            "revoked_reason": session.revokedReason.map(JSONValue.string) ?? .null,
        ])
    }

    static func time(_ date: Date?) -> JSONValue { date.map { .string(iso8601($0)) } ?? .null }

    static func sessionID(_ context: SiwaRequestContext) throws -> UUID {
        let text = context.parameters.get("id") ?? ""
        guard let id = UUID(uuidString: text) else { throw APIError.invalid("session id \(text) is not a UUID") }
        return id
    }

    static func user(_ context: SiwaRequestContext) throws -> (aud: String, sub: String) {
        guard let aud = context.parameters.get("aud")?.removingPercentEncoding, !aud.isEmpty,
            let sub = context.parameters.get("sub")?.removingPercentEncoding, !sub.isEmpty
        else { throw APIError.invalid("the path must be /v1/accounts/{aud}/{sub}") }
        return (aud, sub)
    }
}

/// Reading `/v1` request bodies and parameters, with errors that name the field.
enum JSONBody {
    static func object(_ request: Request, limit: Int) async throws -> [String: JSONValue] {
        let type = request.headers[.contentType]?.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased()
        guard type == "application/json" else {
            throw APIError(.unsupportedMediaType, code: "unsupported_media_type", message: "send the body as Content-Type: application/json")
        }
        if let length = request.headers[.contentLength].flatMap(Int.init), length > limit {
            throw APIError(.contentTooLarge, code: "payload_too_large", message: "the body is larger than \(limit) bytes")
        }
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: limit)
        } catch {
            throw APIError(.contentTooLarge, code: "payload_too_large", message: "the body is larger than \(limit) bytes")
        }
        guard let object = JSONValue.parse(buffer.readableBytesView)?.objectValue else {
            throw APIError.invalid("the body must be a JSON object")
        }
        return object
    }

    static func allowOnly(_ fields: Set<String>, in body: [String: JSONValue], hint: String) throws {
        if let unknown = body.keys.sorted().first(where: { !fields.contains($0) }) {
            throw APIError.invalid("unexpected field \(unknown): \(hint)")
        }
    }

    static func string(_ body: [String: JSONValue], _ field: String, hint: String) throws -> String {
        guard let value = body[field]?.stringValue, !value.isEmpty, value.utf8.count <= 255, !value.utf8.contains(0) else {
            throw APIError.invalid("\(field) must be a non-empty string of at most 255 bytes, without NUL: \(hint)")
        }
        return value
    }

    static func date(_ value: JSONValue) -> Date? {
        guard let text = value.stringValue else { return nil }
        return rfc3339(text)
    }

    static func limit(_ request: Request, default fallback: Int, maximum: Int) throws -> Int {
        guard let text = QueryParameters(request)["limit"] else { return fallback }
        guard let limit = Int(String(text)), (1...maximum).contains(limit) else {
            throw APIError.invalid("limit must be an integer from 1 to \(maximum) (got \(text))")
        }
        return limit
    }
}
