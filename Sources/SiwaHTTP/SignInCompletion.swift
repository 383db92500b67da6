import Foundation
import Logging
import SiwaApple
import SiwaDomain
import SiwaStore

/// What a backend asks for when a user signs in, already parsed from its request.
package struct SignInRequest: Sendable {
    /// How the user proves who they are.
    package enum Proof: Sendable {
        /// `aud` and `sub` as the backend states them (it checked the user itself).
        case stated(aud: String, sub: String)
        /// The identity token Apple returned to the app.
        case identityToken(String)
        /// An authorization code to exchange at Apple, with the identity token returned beside it if sent.
        case authorizationCode(code: String, redirectURI: String?, clientID: String?, identityToken: String?)
    }

    package var proof: Proof
    /// The raw nonce the app generated: checked on the identity token sent, else on the grant's id_token.
    package var nonce: String?
    package var expiresAt: Date

    package init(proof: Proof, nonce: String? = nil, expiresAt: Date) {
        self.proof = proof
        self.nonce = nonce
        self.expiresAt = expiresAt
    }
}

package struct SignInOutcome: Sendable {
    package var session: Session
    /// Whether Apple's refresh token is now kept for the account (a code was exchanged).
    package var keptAppleToken: Bool
}

/// Why a sign-in opened no session. `BackendController` decides what a client is told.
package enum SignInError: Error, Sendable {
    /// An authorization code, on a server without Apple credentials.
    case notConfigured
    /// `aud` stated by the backend is none of the configured bundle IDs.
    case unknownBundleID(String, configured: [String])
    /// A client ID accepted in tokens maps to no bundle ID.
    case noBundleID(clientID: String)
    /// The identity token sent does not verify.
    case identityTokenRejected(VerificationError)
    /// Apple's keys cannot be had right now.
    case keysUnavailable(retryAfter: Duration)
    /// `client_id` names another client than the identity token's `aud`.
    case clientIDMismatch(given: String, identityToken: String)
    /// `client_id` is none of the configured ones.
    case unknownClientID(String, configured: [String])
    /// A code alone, and not exactly one configured client ID to exchange it for.
    case clientIDRequired(configured: [String])
    /// Apple did not grant the code exchange.
    case exchangeRefused(AppleAuthClient.Failure, clientID: String)
    /// Apple granted without a refresh token or an id_token (`missing` names which).
    case incompleteGrant(missing: String)
    /// The grant's id_token is for another client ID than the code was exchanged for.
    case grantForAnotherClient(idToken: String, exchanged: String)
    /// The grant's id_token carries another nonce than the app's.
    case grantNonceMismatch(VerificationError)
    /// The grant's id_token does not verify.
    case grantUnverified(VerificationError)
    /// The code signs in another user than the identity token sent with it.
    case subMismatch
    case accountDeleted(message: String)
    case consentRevoked(message: String)
}

/// The sign-in workflow, without HTTP: the proof checked (identity token, or a code exchanged at
/// Apple and its id_token checked), the refresh token encrypted for the account, the session
/// opened. A refresh token Apple granted for a sign-in that then fails is revoked, since nobody
/// else would ever keep it. Throws `SignInError`, or the store's errors unchanged.
package struct SignInCompletion: Sendable {
    let accounts: AccountStore
    let keys: AppleKeyCache
    /// Bundle IDs: the `aud` of accounts.
    let bundleIDs: Set<String>
    /// Client IDs accepted in identity tokens → the bundle ID whose accounts they sign in to.
    let clientIDs: [String: String]
    let verifier: IdentityTokenVerifier
    /// Code exchange at Apple (nil: no Apple credentials configured).
    let apple: AppleSignIn?

    package init(
        accounts: AccountStore, keys: AppleKeyCache, bundleIDs: Set<String>, clientIDs: [String: String], clockSkew: Duration, apple: AppleSignIn?
    ) {
        self.accounts = accounts
        self.keys = keys
        self.bundleIDs = bundleIDs
        self.clientIDs = clientIDs
        self.apple = apple
        self.verifier = IdentityTokenVerifier(clientIDs: Set(clientIDs.keys), clockSkew: clockSkew)
    }

    /// Whether codes can be exchanged (Apple credentials are configured).
    package var exchangesCodes: Bool { apple != nil }

    package func signIn(_ request: SignInRequest, now: Date, logger: Logger) async throws -> SignInOutcome {
        switch request.proof {
        case .stated(let aud, let sub):
            guard bundleIDs.contains(aud) else { throw SignInError.unknownBundleID(aud, configured: bundleIDs.sorted()) }
            return try await open(aud: aud, sub: sub, request, identity: nil, kept: nil, logger: logger)
        case .identityToken(let token):
            let identity = try await verifySent(token, nonce: request.nonce, now: now)
            guard let aud = clientIDs[identity.clientID] else { throw SignInError.noBundleID(clientID: identity.clientID) }
            return try await open(aud: aud, sub: identity.sub, request, identity: identity, kept: nil, logger: logger)
        case .authorizationCode(let code, let redirectURI, let clientID, let identityToken):
            guard let apple else { throw SignInError.notConfigured }
            var sent: VerifiedIdentity?
            if let identityToken { sent = try await verifySent(identityToken, nonce: request.nonce, now: now) }
            let resolved = try resolveClientID(clientID, identity: sent)
            let kept = try await complete(
                code: code, clientID: resolved, redirectURI: redirectURI, identity: sent, nonce: sent == nil ? request.nonce : nil,
                with: apple, now: now, logger: logger)
            guard let aud = clientIDs[kept.identity.clientID] else { throw SignInError.noBundleID(clientID: kept.identity.clientID) }
            return try await open(aud: aud, sub: kept.identity.sub, request, identity: kept.identity, kept: kept, logger: logger)
        }
    }

    /// A code's outcome at Apple: the identity the account takes, the refresh token kept for it.
    struct Kept {
        var identity: VerifiedIdentity
        var token: KeptAppleToken
        var exchange: AppleAuthRecord
        /// The exchange's record, attributed to the user with the session.
        var exchangeCall: Int?
        var refreshToken: String
        var apple: AppleSignIn
    }

    /// Opens the session; an account that may not sign in gets none, and the grant is revoked.
    private func open(
        aud: String, sub: String, _ request: SignInRequest, identity: VerifiedIdentity?, kept: Kept?, logger: Logger
    ) async throws -> SignInOutcome {
        do {
            let session = try await accounts.createSession(
                aud: aud, sub: sub, expiresAt: request.expiresAt, identity: identity, appleToken: kept?.token, exchangeCall: kept?.exchangeCall)
            return SignInOutcome(session: session, keptAppleToken: kept != nil)
        } catch let error as AccountStoreError {
            if let kept { await discard(kept.refreshToken, clientID: kept.token.clientID, with: kept.apple, logger: logger) }
            switch error {
            case .accountDeleted(let message): throw SignInError.accountDeleted(message: message)
            case .consentRevoked(let message): throw SignInError.consentRevoked(message: message)
            }
        }
    }

    /// The code exchanged at Apple, its id_token checked against the identity token sent with it
    /// (`identity`) or against `nonce`, the refresh token encrypted for the account. The account
    /// takes the identity sent, else the grant's.
    private func complete(
        code: String, clientID: String, redirectURI: String?, identity sent: VerifiedIdentity?, nonce: String?, with apple: AppleSignIn, now: Date,
        logger: Logger
    ) async throws -> Kept {
        let exchanged = try await exchange(code: code, clientID: clientID, redirectURI: redirectURI, nonce: nonce, with: apple, now: now, logger: logger)
        if let sent, sent.sub != exchanged.identity.sub {
            logger.notice("code exchange for another user than the identity token", metadata: ["apple_call": "\(exchanged.record)"])
            await discard(exchanged.refreshToken, clientID: clientID, with: apple, logger: logger)
            throw SignInError.subMismatch
        }
        let identity = sent ?? exchanged.identity
        guard let bundleID = clientIDs[clientID] else { throw SignInError.noBundleID(clientID: clientID) }
        let owner = AppleTokenOwner(aud: bundleID, sub: identity.sub)
        let token = KeptAppleToken(
            clientID: clientID, ciphertext: apple.cipher.encrypt(exchanged.refreshToken, owner: owner),
            fingerprint: AppleAuthRecord.fingerprint(exchanged.refreshToken))
        return Kept(identity: identity, token: token, exchange: exchanged.record, exchangeCall: exchanged.recordID, refreshToken: exchanged.refreshToken, apple: apple)
    }

    /// Revokes the refresh token of a sign-in that failed after Apple granted it (another user
    /// than the identity token, an id_token that does not verify, an account that may not sign in):
    /// nobody keeps it, so nothing else ever would. Recorded like every call to Apple; the
    /// sign-in fails either way.
    private func discard(_ refreshToken: String, clientID: String, with apple: AppleSignIn, logger: Logger) async {
        do {
            let call = try await apple.gateway.revoke(token: refreshToken, hint: .refreshToken, clientID: clientID, about: .none)
            if case .failure(let failure) = call.result {
                logger.warning("the refresh token of a failed sign-in could not be revoked", metadata: ["apple_call": "\(call.record)", "failure": "\(failure)"])
            }
        } catch {
            logger.warning("the revocation of a failed sign-in's refresh token could not be recorded", metadata: ["error": "\(loggable(error))"])
        }
    }

    /// The client ID a code was issued to: the identity token's `aud` when one is sent (`given`,
    /// if any, must be the same), else `given`, else the only configured one.
    private func resolveClientID(_ given: String?, identity: VerifiedIdentity?) throws(SignInError) -> String {
        if let identity {
            if let given, given != identity.clientID { throw .clientIDMismatch(given: given, identityToken: identity.clientID) }
            return identity.clientID
        }
        let configured = clientIDs.keys.sorted()
        if let given {
            guard clientIDs[given] != nil else { throw .unknownClientID(given, configured: configured) }
            return given
        }
        guard configured.count == 1 else { throw .clientIDRequired(configured: configured) }
        return configured[0]
    }

    /// Exchanges `code` at Apple and verifies the id_token of the grant (same key cache and rules as
    /// identity tokens; `nonce` only when given). The code and tokens are never logged; a failure
    /// is logged with the call's record, which shows a fingerprint only.
    private func exchange(
        code: String, clientID: String, redirectURI: String?, nonce: String?, with apple: AppleSignIn, now: Date, logger: Logger
    ) async throws -> (identity: VerifiedIdentity, refreshToken: String, record: AppleAuthRecord, recordID: Int?) {
        let call = try await apple.gateway.exchange(code: code, clientID: clientID, redirectURI: redirectURI)
        let grant: AppleTokenGrant
        switch call.result {
        case .failure(let failure):
            refused(failure, call.record, logger: logger)
            throw SignInError.exchangeRefused(failure, clientID: clientID)
        case .success(let value):
            grant = value
        }
        guard let refreshToken = grant.refreshToken, let idToken = grant.idToken else {
            logger.warning("code exchange granted without a refresh token or id_token", metadata: ["apple_call": "\(call.record)", "grant": "\(grant)"])
            throw SignInError.incompleteGrant(missing: grant.refreshToken == nil ? "refresh_token" : "id_token")
        }
        do {
            let identity = try await checkIdentity(idToken, nonce: nonce, now: now)
            guard identity.clientID == clientID else { throw SignInError.grantForAnotherClient(idToken: identity.clientID, exchanged: clientID) }
            return (identity, refreshToken, call.record, call.recordID)
        } catch let error as VerificationError where error.reason == .nonceMismatch {
            await discard(refreshToken, clientID: clientID, with: apple, logger: logger)
            throw SignInError.grantNonceMismatch(error)
        } catch let error as VerificationError {
            logger.warning("the id_token of a code exchange does not verify", metadata: ["apple_call": "\(call.record)", "reason": "\(error.reason.rawValue)"])
            await discard(refreshToken, clientID: clientID, with: apple, logger: logger)
            throw SignInError.grantUnverified(error)
        } catch {
            await discard(refreshToken, clientID: clientID, with: apple, logger: logger)
            throw error
        }
    }

    /// A code exchange Apple did not grant: logged (a notice when Apple refused the user's code,
    /// a warning when the fault is ours or Apple's); the gateway recorded it with no user (none
    /// was verified), and `invalid_client` there fires the apple_credentials alert.
    private func refused(_ failure: AppleAuthClient.Failure, _ record: AppleAuthRecord, logger: Logger) {
        let level: Logger.Level
        if case .apple(.invalidGrant) = failure { level = .notice } else { level = .warning }
        logger.log(level: level, "authorization code exchange failed", metadata: ["apple_call": "\(record)", "failure": "\(failure)"])
    }

    /// The same key cache and rules as the receiver: throws `VerificationError`, or
    /// `keysUnavailable` when Apple's keys cannot be had.
    private func checkIdentity(_ token: String, nonce: String?, now: Date) async throws -> VerifiedIdentity {
        let jws = try CompactJWS(token)
        let kid = try NotificationVerifier.checkHeader(jws)
        switch await keys.resolve(kid: kid) {
        case .key(let key):
            return try verifier.verify(jws, key: key, nonce: nonce, now: now)
        case .unknown(let kid, _):
            throw VerificationError.invalid(.unknownKey, "no Apple key with kid \(kid), even after refreshing Apple's key set")
        case .unavailable(let retryAfter, _):
            throw SignInError.keysUnavailable(retryAfter: retryAfter)
        }
    }

    /// An identity token the client sent.
    private func verifySent(_ token: String, nonce: String?, now: Date) async throws -> VerifiedIdentity {
        do {
            return try await checkIdentity(token, nonce: nonce, now: now)
        } catch let error as VerificationError {
            throw SignInError.identityTokenRejected(error)
        }
    }
}
