import HTTPTypes
import SiwaApple
import SiwaDomain

/// What completing a sign-in with an authorization code needs: Apple's `/auth/token` through
/// the gateway (the team's client secrets, every call recorded) and the cipher the refresh token
/// is kept under. Nil without Apple credentials.
package struct AppleSignIn: Sendable {
    package var gateway: AppleGateway
    package var cipher: AppleTokenCipher

    package init(gateway: AppleGateway, cipher: AppleTokenCipher) {
        self.gateway = gateway
        self.cipher = cipher
    }

    /// The `reason` words of a failed sign-in completion that are ours, not Apple's.
    package enum Reason: String, Sendable {
        /// The id_token of the exchange names another user than the identity token sent with the code.
        case subMismatch = "sub_mismatch"
        /// Apple's `/auth/token` did not answer, or answered a 5xx or 429.
        case appleUnavailable = "apple_unavailable"
    }

    /// `authorization_code` on a server without Apple credentials.
    static let notConfigured = APIError(
        .notImplemented, code: "not_configured",
        message: "authorization_code needs the Apple credentials, which this server lacks: set SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID, "
            + "SIWA_APPLE_PRIVATE_KEY_FILE and SIWA_APPLE_TOKEN_KEYS (or send identity_token alone)")

    /// How long a client should wait before retrying when Apple did not answer.
    static let retryAfter: Duration = .seconds(5)

    /// The answer for a code exchange Apple did not grant. Apple's refusal of the code
    /// (`invalid_grant`) is the client's: a 401, as for an identity token that fails. Apple's other
    /// words refuse our request or our client secret (`invalid_client`): a 502 naming what to check.
    /// No answer, a 5xx or a 429 is a 503 to retry.
    static func error(for failure: AppleAuthClient.Failure, clientID: String) -> APIError {
        switch failure {
        case .apple(.invalidGrant):
            return APIError(
                .unauthorized, code: "apple_refused",
                message: "Apple refused the authorization code: invalid_grant (the code was already used, or expired: codes live 5 minutes; "
                    + "or it was issued to another client ID or redirect_uri)",
                reason: AppleAuthError.invalidGrant.word)
        case .apple(.invalidClient):
            return APIError(
                .badGateway, code: "apple_refused",
                message: "Apple refused this server's client secret for client ID \(clientID): invalid_client. Check SIWA_APPLE_TEAM_ID, "
                    + "SIWA_APPLE_KEY_ID and SIWA_APPLE_PRIVATE_KEY_FILE (a Sign in with Apple key of the team that owns \(clientID)); "
                    + "`siwa-events doctor` asks Apple",
                reason: AppleAuthError.invalidClient.word)
        case .apple(.unrecognised(let status)) where status >= 500 || status == 429:
            var error = APIError.unavailable(
                "Apple's /auth/token answered HTTP \(status): retry shortly (a code lives 5 minutes and is used up once Apple grants it)",
                retryAfter: retryAfter)
            error.reason = Reason.appleUnavailable.rawValue
            return error
        case .apple(.unrecognised(let status)):
            return APIError(.badGateway, code: "apple_error", message: "Apple's /auth/token answered HTTP \(status), which is none of its documented answers")
        case .apple(let refusal):
            let word = refusal.word ?? "unrecognised"
            return APIError(
                .badGateway, code: "apple_refused",
                message: "Apple refused this server's code exchange for client ID \(clientID): \(word) (check that the client ID is one of the team's)",
                reason: word)
        case .transport(let why):
            var error = APIError.unavailable("no answer from Apple's /auth/token (\(why)): retry shortly (a code lives 5 minutes)", retryAfter: retryAfter)
            error.reason = Reason.appleUnavailable.rawValue
            return error
        case .malformedAnswer(let status):
            return APIError(.badGateway, code: "apple_error", message: "Apple's /auth/token answered \(status) with a body that is not its token JSON")
        case .clientSecret(let why):
            return APIError(.badGateway, code: "apple_error", message: "no client secret could be made for Apple (\(why)): check SIWA_APPLE_PRIVATE_KEY_FILE")
        case .invalidInput(let why):
            return APIError(.badGateway, code: "apple_error", message: "the call to Apple was not sent: \(why)")
        }
    }
}

extension SignInError {
    /// What a client is told when its sign-in opened no session.
    var apiError: APIError {
        switch self {
        case .notConfigured:
            return AppleSignIn.notConfigured
        case .unknownBundleID(let aud, let configured):
            return .invalid("aud \(aud) is not one of SIWA_APPLE_BUNDLE_IDS (\(configured.joined(separator: ", ")))")
        case .noBundleID(let clientID):
            return .invalid("client ID \(clientID) has no bundle ID (SIWA_APPLE_CLIENT_IDS)")
        case .identityTokenRejected(.malformed(let message)):
            // Not a token Apple could have signed: as unacceptable as a bad signature.
            return APIError(.unauthorized, code: "invalid_token", message: "identity_token: \(message)", reason: RejectionReason.malformedRequest.rawValue)
        case .identityTokenRejected(.invalid(let reason, let message)):
            return APIError(.unauthorized, code: "invalid_token", message: "identity_token: \(message)", reason: reason.rawValue)
        case .keysUnavailable(let retryAfter):
            return .unavailable("Apple's keys cannot be checked right now; retry later", retryAfter: retryAfter)
        case .clientIDMismatch(let given, let identityToken):
            return .invalid("client_id \(given) is not the identity token's aud (\(identityToken)): leave client_id out")
        case .unknownClientID(let given, let configured):
            return .invalid("client_id \(given) is not one of SIWA_APPLE_CLIENT_IDS (\(configured.joined(separator: ", ")))")
        case .clientIDRequired(let configured):
            return .invalid(
                "client_id is required with authorization_code alone: \(configured.count) client IDs are configured (\(configured.joined(separator: ", "))); "
                    + "name the one the code was issued to")
        case .exchangeRefused(let failure, let clientID):
            return AppleSignIn.error(for: failure, clientID: clientID)
        case .incompleteGrant(let missing):
            return APIError(.badGateway, code: "apple_error", message: "Apple's answer to the code exchange has no \(missing); no session was opened")
        case .grantForAnotherClient(let idToken, let exchanged):
            return APIError(.badGateway, code: "apple_error", message: "the id_token Apple returned is for client ID \(idToken), not \(exchanged)")
        case .grantNonceMismatch(let error):
            return APIError(.unauthorized, code: "invalid_token", message: "the id_token of the code: \(error.message)", reason: error.reason.rawValue)
        case .grantUnverified(let error):
            return APIError(
                .badGateway, code: "apple_error", message: "the id_token Apple returned for the code does not verify: \(error.message)",
                reason: error.reason.rawValue)
        case .subMismatch:
            return APIError(
                .unauthorized, code: "invalid_token",
                message: "the authorization code signs in another user than identity_token (its id_token has another sub); no session was opened",
                reason: AppleSignIn.Reason.subMismatch.rawValue)
        case .accountDeleted(let message):
            return APIError(.conflict, code: "conflict", message: message, reason: "account_deleted")
        case .consentRevoked(let message):
            return APIError(.conflict, code: "conflict", message: message, reason: "consent_revoked")
        }
    }
}
