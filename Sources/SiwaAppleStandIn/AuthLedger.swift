import Foundation
import SiwaDomain

/// What the stand-in has issued and been sent: authorization codes, grants (one per code exchange,
/// with its refresh token and access tokens), migration access tokens, the users marked for app
/// transfers, the revocation records, the failure switch and the migration rate limit.
/// Values only, `now` passed in; every table is bounded (the oldest entries go first), so no
/// stream of requests can make it grow without end.
package struct AuthLedger: Sendable {
    package struct Limits: Sendable {
        /// Codes waiting to be exchanged, grants, access tokens: each table holds at most this many.
        package var maximumEntries = 1_000
        /// Revocation records kept (the newest).
        package var maximumRevocations = 1_000
        /// A code's lifetime (Apple's: 5 minutes).
        package var codeLifetime: TimeInterval = 300
        /// An access token's `expires_in` (Apple's: an hour).
        package var accessTokenLifetime = 3600
        /// Requests per second `/auth/usermigrationinfo` takes before answering 429 (0: no limit;
        /// TN3159 documents none). A token bucket holding one second's worth, driven by `now`.
        package var migrationPerSecond: Double = 0

        package init() {}
    }

    /// A user's authorization as a code carries it, and the grant made from it.
    package struct Authorization: Sendable, Equatable {
        package var clientID: String
        package var sub: String
        package var email: String?
        package var isPrivateEmail: Bool?
        /// The nonce of the authorization request, embedded as given (an app passes SHA-256 hex).
        package var nonce: String?
        /// The `redirect_uri` of the authorization request (web sign-ins); the exchange must repeat it.
        package var redirectURI: String?

        package init(
            clientID: String, sub: String, email: String? = nil, isPrivateEmail: Bool? = nil, nonce: String? = nil,
            redirectURI: String? = nil
        ) {
            self.clientID = clientID
            self.sub = sub
            self.email = email
            self.isPrivateEmail = isPrivateEmail
            self.nonce = nonce
            self.redirectURI = redirectURI
        }
    }

    /// Tokens issued by one `/auth/token` answer; `refreshToken` only for a code exchange.
    package struct Issued: Sendable, Equatable {
        package var authorization: Authorization
        package var accessToken: String
        package var refreshToken: String?
    }

    /// A user as `/standin/users` marked them for app transfers (unmarked: neither).
    package struct MigrationUser: Sendable, Equatable {
        package var sub: String
        /// The recipient gets a new relay address for this user.
        package var isPrivateEmail: Bool
        /// The user stopped using Sign in with Apple for the app: Apple answers `invalid_request`.
        package var revoked: Bool

        package init(sub: String, isPrivateEmail: Bool = false, revoked: Bool = false) {
            self.sub = sub
            self.isPrivateEmail = isPrivateEmail
            self.revoked = revoked
        }
    }

    /// A `client_credentials` access token: for one client of one team, until `expiresAt`.
    private struct MigrationAccess {
        var clientID: String
        var teamID: String
        var expiresAt: Date
    }

    private struct Code {
        var authorization: Authorization
        var expiresAt: Date
    }

    private struct Grant {
        var authorization: Authorization
        var revoked = false
    }

    package let limits: Limits
    private var codes: BoundedTable<Code>
    /// By refresh token.
    private var grants: BoundedTable<Grant>
    /// Access token → the refresh token of its grant.
    private var accessTokens: BoundedTable<String>
    private var migrationAccess: BoundedTable<MigrationAccess>
    private var users: BoundedTable<MigrationUser>
    /// The migration rate limit's bucket: requests it still admits, as of when.
    private var bucket: (tokens: Double, at: Date)?
    package private(set) var revocations: [RevocationRecord] = []
    private var failures: [StandInEndpoint: (status: Int, remaining: Int)] = [:]

    package init(limits: Limits = Limits()) {
        self.limits = limits
        codes = BoundedTable(limit: limits.maximumEntries)
        grants = BoundedTable(limit: limits.maximumEntries)
        accessTokens = BoundedTable(limit: limits.maximumEntries)
        migrationAccess = BoundedTable(limit: limits.maximumEntries)
        users = BoundedTable(limit: limits.maximumEntries)
    }

    /// `grant_type=client_credentials` for an authenticated client of `teamID`: a token for an `accessTokenLifetime`.
    package mutating func issueMigrationToken(clientID: String, teamID: String, now: Date) -> String {
        let token = Self.token(prefix: "m")
        migrationAccess.insert(token, MigrationAccess(clientID: clientID, teamID: teamID, expiresAt: now.addingTimeInterval(TimeInterval(limits.accessTokenLifetime))))
        return token
    }

    /// Whether `token` is a live migration token of this client and team (else `invalid_grant`).
    package func checkMigrationToken(_ token: String, clientID: String, teamID: String, now: Date) throws(AppleAuthError) {
        guard let access = migrationAccess[token], access.clientID == clientID, access.teamID == teamID, now < access.expiresAt else {
            throw .invalidGrant
        }
    }

    package mutating func markUser(_ user: MigrationUser) { users.insert(user.sub, user) }

    /// How `sub` was marked; unmarked users are neither private-relay nor revoked.
    package func user(_ sub: String) -> MigrationUser { users[sub] ?? MigrationUser(sub: sub) }

    /// Takes one request from the migration rate limit: false when none is left at `now`.
    package mutating func admitMigrationRequest(now: Date) -> Bool {
        let rate = limits.migrationPerSecond
        guard rate > 0 else { return true }
        let capacity = max(1, rate)
        var (tokens, at) = bucket ?? (capacity, now)
        tokens = min(capacity, tokens + max(0, now.timeIntervalSince(at)) * rate)
        guard tokens >= 1 else {
            bucket = (tokens, max(at, now))
            return false
        }
        bucket = (tokens - 1, max(at, now))
        return true
    }

    /// A new code for `authorization`, valid `codeLifetime` from `now`, for one exchange.
    package mutating func issueCode(_ authorization: Authorization, now: Date) -> String {
        let code = Self.token(prefix: "c")
        codes.insert(code, Code(authorization: authorization, expiresAt: now.addingTimeInterval(limits.codeLifetime)))
        return code
    }

    /// `grant_type=authorization_code`, the client already authenticated. The code is used up by its
    /// client's first attempt, whatever the outcome; another client's attempt leaves it alone.
    package mutating func exchange(code: String, clientID: String, redirectURI: String?, now: Date) throws(AppleAuthError) -> Issued {
        guard let issued = codes[code], issued.authorization.clientID == clientID else { throw .invalidGrant }
        codes.remove(code)
        guard now < issued.expiresAt, redirectURI == issued.authorization.redirectURI else { throw .invalidGrant }
        let refreshToken = Self.token(prefix: "r")
        grants.insert(refreshToken, Grant(authorization: issued.authorization))
        let accessToken = Self.token(prefix: "a")
        accessTokens.insert(accessToken, refreshToken)
        return Issued(authorization: issued.authorization, accessToken: accessToken, refreshToken: refreshToken)
    }

    /// `grant_type=refresh_token`: a new access token for a grant of this client that is not revoked.
    package mutating func refresh(token: String, clientID: String) throws(AppleAuthError) -> Issued {
        guard let grant = grants[token], grant.authorization.clientID == clientID, !grant.revoked else { throw .invalidGrant }
        let accessToken = Self.token(prefix: "a")
        accessTokens.insert(accessToken, token)
        return Issued(authorization: grant.authorization, accessToken: accessToken, refreshToken: nil)
    }

    /// `/auth/revoke` for an authenticated client: revoking a refresh or an access token revokes
    /// its whole grant (the user must sign in again), as Apple's revocation ends the authorization.
    package mutating func revoke(token: String, clientID: String) -> RevocationOutcome {
        guard let refreshToken = grants[token] != nil ? Optional(token) : accessTokens[token], var grant = grants[refreshToken] else {
            return .unknownToken
        }
        guard grant.authorization.clientID == clientID else { return .otherClient }
        guard !grant.revoked else { return .alreadyRevoked }
        grant.revoked = true
        grants.update(refreshToken, grant)
        return .revoked
    }

    /// Keeps `record`, dropping the oldest beyond `maximumRevocations`.
    package mutating func record(_ record: RevocationRecord) {
        revocations.append(record)
        if revocations.count > limits.maximumRevocations { revocations.removeFirst(revocations.count - limits.maximumRevocations) }
    }

    /// The failure switch: the next `count` requests to `endpoint` are answered `status`.
    package mutating func failNext(_ count: Int, of endpoint: StandInEndpoint, status: Int) {
        failures[endpoint] = count > 0 ? (status: status, remaining: count) : nil
    }

    /// The status the switch answers this request to `endpoint` with, if it is still on.
    package mutating func takeFailure(_ endpoint: StandInEndpoint) -> Int? {
        guard let failure = failures[endpoint] else { return nil }
        failures[endpoint] = failure.remaining > 1 ? (status: failure.status, remaining: failure.remaining - 1) : nil
        return failure.status
    }

    /// An opaque token: a letter saying what it is, then 32 random bytes as hex.
    private static func token(prefix: String) -> String {
        var generator = SystemRandomNumberGenerator()
        return prefix + (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &generator)) }.joined()
    }
}

/// The stand-in's endpoints the failure switch can act on.
package enum StandInEndpoint: String, Sendable, CaseIterable {
    case token
    case revoke
    case userMigrationInfo = "usermigrationinfo"
}
