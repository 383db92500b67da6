import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import SiwaDomain
import Synchronization

/// Apple's endpoints: `POST /auth/token` (code exchange, refresh, migration token), `POST /auth/revoke`
/// and `POST /auth/usermigrationinfo` (TN3159).
extension AppleAuthStandIn {
    /// Apple's round trip (`--latency`), before any answer.
    func waitLatency() async throws {
        if configuration.latency > .zero { try await Task.sleep(for: configuration.latency) }
    }

    func addAuthRoutes(to router: Router<BasicRequestContext>) {
        router.post("/auth/token") { request, _ -> Response in
            try await self.waitLatency()
            if let status = self.ledger.withLock({ $0.takeFailure(.token) }) { return Response(status: .init(code: status)) }
            guard let form = await self.readForm(request) else { return AppleAnswer.error(.invalidRequest) }
            do throws(AppleAuthError) {
                return try self.token(form)
            } catch {
                return AppleAnswer.error(error)
            }
        }
        router.post("/auth/usermigrationinfo") { request, _ -> Response in
            try await self.waitLatency()
            if let status = self.ledger.withLock({ $0.takeFailure(.userMigrationInfo) }) { return Response(status: .init(code: status)) }
            let now = self.configuration.now()
            guard self.ledger.withLock({ $0.admitMigrationRequest(now: now) }) else { return Response(status: .tooManyRequests) }
            guard let form = await self.readForm(request) else { return AppleAnswer.error(.invalidRequest) }
            do throws(AppleAuthError) {
                return try self.userMigrationInfo(form, authorization: request.headers[.authorization], now: now)
            } catch {
                return AppleAnswer.error(error)
            }
        }
        router.post("/auth/revoke") { request, _ -> Response in
            try await self.waitLatency()
            let receivedAt = self.configuration.now()
            if let status = self.ledger.withLock({ $0.takeFailure(.revoke) }) {
                let form = await self.readForm(request)
                self.record(form, at: receivedAt, status: status, outcome: .injectedFailure(status: status))
                return Response(status: .init(code: status))
            }
            guard let form = await self.readForm(request) else {
                self.record(nil, at: receivedAt, status: 400, outcome: .refused(.invalidRequest))
                return AppleAnswer.error(.invalidRequest)
            }
            do throws(AppleAuthError) {
                let outcome = try self.revoke(form)
                self.record(form, at: receivedAt, status: 200, outcome: outcome)
                return Response(status: .ok)
            } catch {
                self.record(form, at: receivedAt, status: 400, outcome: .refused(error))
                return AppleAnswer.error(error)
            }
        }
    }

    /// The body as a form: nil when it is not one (another content type, too large, malformed).
    func readForm(_ request: Request) async -> FormBody? {
        guard FormBody.isForm(contentType: request.headers[.contentType]),
            let body = try? await request.body.collect(upTo: configuration.maximumBodySize)
        else { return nil }
        return FormBody(body.readableBytesView)
    }

    /// Checks the client secret as Apple does; every refusal is `invalid_client`, its reason logged.
    /// The team whose key signed it is the caller.
    @discardableResult
    func authenticate(_ form: FormBody, clientID: String) throws(AppleAuthError) -> StandInTeam {
        guard let secret = form["client_secret"] else { throw .invalidRequest }
        do throws(ClientSecretRejection) {
            return try secrets.check(secret, clientID: clientID, now: configuration.now())
        } catch {
            logger.notice("client secret refused", metadata: ["client_id": "\(clientID)", "reason": "\(error.rawValue)"])
            throw .invalidClient
        }
    }

    private func token(_ form: FormBody) throws(AppleAuthError) -> Response {
        guard let clientID = form["client_id"], form["client_secret"] != nil, let grantType = form["grant_type"] else {
            throw .invalidRequest
        }
        let now = configuration.now()
        let issued: AuthLedger.Issued
        switch grantType {
        case "authorization_code":
            guard let code = form["code"] else { throw .invalidRequest }
            try authenticate(form, clientID: clientID)
            issued = try ledger.withLock { ledger throws(AppleAuthError) in
                try ledger.exchange(code: code, clientID: clientID, redirectURI: form["redirect_uri"], now: now)
            }
        case "refresh_token":
            guard let refreshToken = form["refresh_token"] else { throw .invalidRequest }
            try authenticate(form, clientID: clientID)
            issued = try ledger.withLock { ledger throws(AppleAuthError) in try ledger.refresh(token: refreshToken, clientID: clientID) }
        case "client_credentials":
            guard let scope = form["scope"] else { throw .invalidRequest }
            let team = try authenticate(form, clientID: clientID)
            guard scope == AppleAuthScope.userMigration.rawValue else { throw .invalidScope }
            let token = ledger.withLock { $0.issueMigrationToken(clientID: clientID, teamID: team.teamID, now: now) }
            return AppleAnswer.json([
                "access_token": .string(token), "token_type": "Bearer", "expires_in": .number(Double(configuration.limits.accessTokenLifetime)),
            ])
        default:
            throw .unsupportedGrantType
        }
        let user = issued.authorization
        let idToken: String
        do {
            idToken = try configuration.signer.identityToken(
                aud: user.clientID, sub: user.sub, email: user.email,
                isPrivateEmail: user.email == nil ? nil : (user.isPrivateEmail ?? false), nonce: user.nonce, realUserStatus: nil,
                issuedAt: now)
        } catch {
            logger.error("cannot sign an id_token", metadata: ["error": "\(error)"])
            return Response(status: .internalServerError)
        }
        var answer: [String: JSONValue] = [
            "access_token": .string(issued.accessToken), "token_type": "Bearer",
            "expires_in": .number(Double(configuration.limits.accessTokenLifetime)), "id_token": .string(idToken),
        ]
        if let refreshToken = issued.refreshToken { answer["refresh_token"] = .string(refreshToken) }
        return AppleAnswer.json(.object(answer))
    }

    /// `/auth/usermigrationinfo`, after the rate limit. Refusals, as the stand-in chooses them where
    /// Apple does not say: no `Authorization: Bearer` → `invalid_client` (the caller did not
    /// authenticate); a Bearer that is unknown, expired, or another client's or team's →
    /// `invalid_grant` (fetch a new token). Then, for `sub` + `target`: a target that is not a team
    /// ID, or is the caller's own team (Apple answers that with useless identifiers, nov/apple_id
    /// #21; the stand-in refuses), or a user marked revoked → `invalid_request`; for `transfer_sub`:
    /// one not of this stand-in, not for the caller's team, or for a revoked user → `invalid_request`.
    private func userMigrationInfo(_ form: FormBody, authorization: String?, now: Date) throws(AppleAuthError) -> Response {
        guard let clientID = form["client_id"], form["client_secret"] != nil else { throw .invalidRequest }
        guard let bearer = Self.bearerToken(authorization) else { throw .invalidClient }
        let team = try authenticate(form, clientID: clientID)
        try ledger.withLock { ledger throws(AppleAuthError) in try ledger.checkMigrationToken(bearer, clientID: clientID, teamID: team.teamID, now: now) }
        switch (form["sub"], form["target"], form["transfer_sub"]) {
        case (let sub?, let target?, nil):
            guard sub.utf8.count <= TransferSubs.maximumSubLength, ClientSecretPolicy.isAppleIdentifier(target), target != team.teamID,
                !ledger.withLock({ $0.user(sub).revoked })
            else { throw .invalidRequest }
            return AppleAnswer.json(["transfer_sub": .string(transfers.seal(.init(sender: team.teamID, target: target, sub: sub)))])
        case (nil, nil, let transferSub?):
            guard let transfer = transfers.open(transferSub), transfer.target == team.teamID else { throw .invalidRequest }
            let user = ledger.withLock { $0.user(transfer.sub) }
            guard !user.revoked else { throw .invalidRequest }
            var answer: [String: JSONValue] = ["sub": .string(transfers.recipientSub(transfer))]
            if user.isPrivateEmail {
                answer["email"] = .string(transfers.relayEmail(transfer))
                answer["is_private_email"] = .bool(true)
            }
            return AppleAnswer.json(.object(answer))
        default:
            throw .invalidRequest
        }
    }

    /// The token of an `Authorization: Bearer <token>` header (the scheme in any case, RFC 6750); nil otherwise.
    static func bearerToken(_ header: String?) -> String? {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return nil }
        let token = header.dropFirst(7).trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }

    private func revoke(_ form: FormBody) throws(AppleAuthError) -> RevocationOutcome {
        guard let clientID = form["client_id"], form["client_secret"] != nil, let token = form["token"] else { throw .invalidRequest }
        if let hint = form["token_type_hint"], hint != "refresh_token", hint != "access_token" { throw .invalidRequest }
        try authenticate(form, clientID: clientID)
        return ledger.withLock { $0.revoke(token: token, clientID: clientID) }
    }

    /// Keeps what a revocation request sent (with its answer) for `/standin/revocations`.
    private func record(_ form: FormBody?, at receivedAt: Date, status: Int, outcome: RevocationOutcome) {
        let record = RevocationRecord(
            clientID: form?.fields["client_id"], tokenTypeHint: form?.fields["token_type_hint"], token: form?.fields["token"],
            receivedAt: receivedAt, status: status, outcome: outcome)
        ledger.withLock { $0.record(record) }
    }
}
