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
    let settings: Settings
    /// The sign-in workflow behind `POST /v1/sessions`.
    let signIn: SignInCompletion
    /// The time identity tokens are checked at (tests verify real, long-expired tokens at theirs).
    let clock: @Sendable () -> Date

    package init(
        accounts: AccountStore, keys: AppleKeyCache, settings: Settings, appleSignIn: AppleSignIn? = nil, clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.accounts = accounts
        self.settings = settings
        self.clock = clock
        self.signIn = SignInCompletion(
            accounts: accounts, keys: keys, bundleIDs: settings.bundleIDs, clientIDs: settings.clientIDs, clockSkew: settings.clockSkew,
            apple: appleSignIn)
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
        let parsed = try signInRequest(body, now: now)
        do {
            let outcome = try await signIn.signIn(parsed, now: now, logger: context.logger)
            return .json(Self.json(outcome.session), status: .created)
        } catch let error as SignInError {
            throw error.apiError
        }
    }

    /// The body of `POST /v1/sessions`: an authorization code (with the identity token returned
    /// beside it, if any), an identity token, or `aud` and `sub`. Errors name the field.
    private func signInRequest(_ body: [String: JSONValue], now: Date) throws -> SignInRequest {
        let expiresAt = try expiresAt(body, now: now)
        if body["authorization_code"] != nil {
            try JSONBody.allowOnly(
                ["authorization_code", "redirect_uri", "client_id", "identity_token", "nonce", "expires_at"], in: body,
                hint: "with authorization_code, aud and sub come from Apple's id_token")
            guard signIn.exchangesCodes else { throw SignInError.notConfigured.apiError }
            let nonce = try Self.nonce(body)
            let identityToken = body["identity_token"] == nil ? nil : try Self.identityToken(body)
            let code = try Self.opaque(body, "authorization_code", hint: "the code Apple returned to your app with the identity token")
            let redirectURI = body["redirect_uri"] == nil || body["redirect_uri"] == .null
                ? nil : try Self.opaque(body, "redirect_uri", hint: "the redirect_uri of your web sign-in, exactly as sent to Apple")
            let clientID = body["client_id"] == nil || body["client_id"] == .null
                ? nil : try JSONBody.string(body, "client_id", hint: "the client ID (bundle ID or Services ID) the code was issued to")
            return SignInRequest(
                proof: .authorizationCode(code: code, redirectURI: redirectURI, clientID: clientID, identityToken: identityToken), nonce: nonce,
                expiresAt: expiresAt)
        }
        if body["identity_token"] != nil {
            try JSONBody.allowOnly(["identity_token", "nonce", "expires_at"], in: body, hint: "with identity_token, aud and sub come from the token")
            let nonce = try Self.nonce(body)
            return SignInRequest(proof: .identityToken(try Self.identityToken(body)), nonce: nonce, expiresAt: expiresAt)
        }
        try JSONBody.allowOnly(["aud", "sub", "expires_at"], in: body, hint: "send identity_token, authorization_code, or aud and sub")
        let aud = try JSONBody.string(body, "aud", hint: "your app's bundle ID")
        let sub = try JSONBody.string(body, "sub", hint: "Apple's user identifier")
        return SignInRequest(proof: .stated(aud: aud, sub: sub), expiresAt: expiresAt)
    }

    /// `expires_at` if given (in the future), else the session TTL from `now`.
    private func expiresAt(_ body: [String: JSONValue], now: Date) throws -> Date {
        guard let value = body["expires_at"] else { return now.addingTimeInterval(settings.sessionTTL.timeInterval) }
        guard let date = JSONBody.date(value) else {
            throw APIError.invalid("expires_at must be an ISO-8601 time like 2026-12-31T23:59:59Z")
        }
        guard date > now else { throw APIError.invalid("expires_at must be in the future") }
        return date
    }

    private static func nonce(_ body: [String: JSONValue]) throws -> String? {
        switch body["nonce"] {
        case nil, .null?: return nil
        case .string(let text)? where !text.isEmpty && text.utf8.count <= 512: return text
        default: throw APIError.invalid("nonce must be the raw nonce string your app generated (1-512 characters)")
        }
    }

    private static func identityToken(_ body: [String: JSONValue]) throws -> String {
        guard let token = body["identity_token"]?.stringValue, !token.isEmpty else {
            throw APIError.invalid("identity_token must be a string: the id_token Apple returned to your app")
        }
        return token
    }

    /// An opaque string field (a code, a URI): non-empty, at most 2048 bytes, without NUL.
    private static func opaque(_ body: [String: JSONValue], _ field: String, hint: String) throws -> String {
        guard let value = body[field]?.stringValue, !value.isEmpty, value.utf8.count <= 2048, !value.utf8.contains(0) else {
            throw APIError.invalid("\(field) must be a non-empty string of at most 2048 bytes: \(hint)")
        }
        return value
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
            "updated_at": .string(iso8601(account.updatedAt)), "previous_subs": .array(account.previousSubs.map(JSONValue.string)),
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
