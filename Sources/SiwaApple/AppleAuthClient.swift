import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import SiwaDomain
import SiwaRuntime

/// Apple's `/auth/token`, `/auth/revoke` and `/auth/usermigrationinfo`: form-encoded POSTs with a
/// minted client secret (and, for the last, the migration access token as a Bearer header).
/// Every call returns, beside its result, a record of what was sent (`AppleAuthRecord`), because
/// `/auth/revoke` answers 200 to anything. No redirect is followed; each call has one deadline.
package struct AppleAuthClient: Sendable {
    package struct Configuration: Sendable {
        /// Where Apple serves `/auth/token` and `/auth/revoke`.
        package static let appleAuthURL = URL(string: "https://appleid.apple.com")!

        package var baseURL: URL
        /// The longest a call (connect, request, whole answer) may take.
        package var timeout: Duration
        /// Apple's answers are a few KiB; a larger one is refused unread.
        package var maximumResponseSize: Int

        package init(baseURL: URL = Configuration.appleAuthURL, timeout: Duration = .seconds(10), maximumResponseSize: Int = 64 * 1024) {
            self.baseURL = baseURL
            self.timeout = timeout
            self.maximumResponseSize = maximumResponseSize
        }
    }

    /// Why a call did not succeed.
    package enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// Apple refused: one of its words, or any other status that is not a 2xx.
        case apple(AppleAuthError)
        /// A 2xx whose body is not what the endpoint returns, or is over the size limit.
        case malformedAnswer(status: Int)
        /// No answer: connection, TLS, deadline.
        case transport(String)
        case clientSecret(String)
        /// Refused before sending: the input cannot be a valid request (nothing was sent).
        case invalidInput(String)

        package var description: String {
            switch self {
            case .invalidInput(let why): why
            case .apple(let error): "\(error)"
            case .malformedAnswer(let status): "Apple answered \(status) with a body that is not the expected JSON"
            case .transport(let why): "no answer from Apple: \(why)"
            case .clientSecret(let why): why
            }
        }
    }

    /// A call's outcome and the record of what it sent.
    package struct Call<Value: Sendable>: Sendable {
        package var record: AppleAuthRecord
        package var result: Result<Value, Failure>
        /// Apple's `Retry-After` (seconds) on a 429 or 503.
        package var retryAfter: Duration? = nil

        /// Apple answered 429: too many calls.
        package var isRateLimited: Bool { record.status == 429 }

        func flatMap<Other>(_ transform: (Value) -> Result<Other, Failure>) -> Call<Other> {
            Call<Other>(record: record, result: result.flatMap(transform), retryAfter: retryAfter)
        }
    }

    package let configuration: Configuration
    private let minter: ClientSecretMinter
    private let now: @Sendable () -> Date

    /// `now` dates the client secrets (tests move it).
    package init(configuration: Configuration = .init(), minter: ClientSecretMinter, now: @escaping @Sendable () -> Date = { Date() }) {
        self.configuration = configuration
        self.minter = minter
        self.now = now
    }

    /// Sign-in completion: the authorization code for tokens (`redirectURI` for web sign-ins).
    package func exchange(code: String, clientID: String, redirectURI: String? = nil) async -> Call<AppleTokenGrant> {
        await tokenCall(.exchange(code: code, redirectURI: redirectURI), clientID: clientID)
    }

    /// Validates a refresh token (the answer has no new refresh token).
    package func refresh(refreshToken: String, clientID: String) async -> Call<AppleTokenGrant> {
        await tokenCall(.refresh(refreshToken: refreshToken), clientID: clientID)
    }

    /// Revokes a token. Apple answers 200 whether or not the token was valid.
    package func revoke(token: String, hint: AppleTokenKind, clientID: String) async -> Call<Void> {
        await send(.revoke(token: token, hint: hint), clientID: clientID).flatMap { _ in .success(()) }
    }

    /// The access token for `/auth/usermigrationinfo` (an hour; `MigrationTokenCache` reuses it).
    package func migrationAccessToken(clientID: String) async -> Call<AppleMigrationToken> {
        await send(.migrationToken, clientID: clientID).flatMap { Self.parsed($0, AppleMigrationToken.parse) }
    }

    /// Sending team: the `transfer_sub` of our user `sub` for the recipient team `target`. A target
    /// that is not a team ID, or is our own team, is refused unsent: Apple would answer the latter
    /// with identifiers no team can use (nov/apple_id #21).
    package func transferSub(of sub: String, target: String, clientID: String, accessToken: String) async -> Call<String> {
        let request = AppleAuthRequest.transferSub(sub: sub, target: target)
        let refusal: String? =
            if sub.isEmpty { "the sub to transfer must not be empty" }
            else if !ClientSecretPolicy.isAppleIdentifier(target) {
                "the target must be the recipient's team ID: 10 characters, A-Z and 0-9 (got \"\(UntrustedText.bounded(target, limit: 32))\")"
            } else if target == minter.policy.teamID { "the target \(target) is this team: a transfer_sub is for the recipient team's ID" }
            else { nil }
        if let refusal { return Call(record: request.record(clientID: clientID), result: .failure(.invalidInput(refusal))) }
        return await send(request, clientID: clientID, bearer: accessToken).flatMap { Self.parsed($0, AppleTransferSub.parse) }
    }

    /// Receiving team: the user behind a `transfer_sub` (their `sub` in our team, a relay email).
    package func migratedUser(transferSub: String, clientID: String, accessToken: String) async -> Call<AppleMigratedUser> {
        if transferSub.isEmpty {
            return Call(record: AppleAuthRequest.migratedUser(transferSub: transferSub).record(clientID: clientID), result: .failure(.invalidInput("the transfer_sub must not be empty")))
        }
        return await send(.migratedUser(transferSub: transferSub), clientID: clientID, bearer: accessToken).flatMap { Self.parsed($0, AppleMigratedUser.parse) }
    }

    private static func parsed<Value>(_ answer: Answer, _ parse: ([UInt8]) -> Value?) -> Result<Value, Failure> {
        guard let value = parse(answer.body) else { return .failure(.malformedAnswer(status: answer.status)) }
        return .success(value)
    }

    private func tokenCall(_ request: AppleAuthRequest, clientID: String) async -> Call<AppleTokenGrant> {
        await send(request, clientID: clientID).flatMap { Self.parsed($0, AppleTokenGrant.parse) }
    }

    private struct Answer: Sendable {
        var status: Int
        var body: [UInt8]
        var retryAfter: Duration?
    }

    /// Sends `request`; a 2xx is an `Answer`, anything else a `Failure`, and the record says which.
    /// `bearer` goes only to `/auth/usermigrationinfo`, the one endpoint that takes it.
    private func send(_ request: AppleAuthRequest, clientID: String, bearer: String? = nil) async -> Call<Answer> {
        var record = request.record(clientID: clientID)
        let url = configuration.baseURL.absoluteString.trimmingSuffix("/") + request.endpoint.rawValue
        guard LoopbackHost.allowsCalls(to: configuration.baseURL) else {
            return Call(record: record, result: .failure(.transport("refused \(URLRedaction.redacted(configuration.baseURL)): plain http only to a loopback address")))
        }
        let secret: ClientSecretMinter.Secret
        do {
            secret = try minter.secret(clientID: clientID, now: now())
        } catch {
            return Call(record: record, result: .failure(.clientSecret(error.description)))
        }
        var http = HTTPClientRequest(url: url)
        http.method = .POST
        http.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        http.headers.add(name: "Accept", value: "application/json")
        if request.endpoint == .userMigrationInfo, let bearer { http.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        http.body = .bytes(ByteBuffer(string: FormURLEncoding.encode(request.fields(clientID: clientID, clientSecret: secret.jwt))))
        let (outgoing, limit, timeout) = (http, configuration.maximumResponseSize, configuration.timeout)
        let answer: Answer
        do {
            answer = try await withDeadline(timeout) {
                let response = try await AppleHTTP.client.execute(outgoing, timeout: TimeAmount(timeout))
                // Over the limit is still an answer with a status: the body is then unread.
                let body = (try? await response.body.collect(upTo: limit)) ?? ByteBuffer()
                let retryAfter = response.headers.first(name: "Retry-After").flatMap(Int64.init).map { Duration.seconds(min(max($0, 0), 3_600)) }
                return Answer(status: Int(response.status.code), body: Array(buffer: body), retryAfter: retryAfter)
            }
        } catch {
            return Call(record: record, result: .failure(.transport(URLRedaction.scrubbed("\(error)"))))
        }
        record.status = answer.status
        guard (200..<300).contains(answer.status) else {
            let refusal = AppleAuthError(status: answer.status, body: answer.body)
            record.error = refusal
            return Call(record: record, result: .failure(.apple(refusal)), retryAfter: answer.retryAfter)
        }
        return Call(record: record, result: .success(answer))
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
