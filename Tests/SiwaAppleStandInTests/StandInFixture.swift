import AsyncHTTPClient
import Crypto
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Synchronization
import Testing

/// A clock a test moves by hand: codes expire and secrets are checked by it, never by waiting.
final class MovableClock: Sendable {
    private let value: Mutex<Date>
    init(_ start: Date) { value = Mutex(start) }
    var now: Date { value.withLock { $0 } }
    func advance(by seconds: TimeInterval) { value.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

/// A running stand-in on a loopback port: one team with one key and two client IDs, a recipient
/// team (for app transfers) owning `clientID` too, the clock at a fixed time, and what a test
/// needs to talk to it.
struct StandIn {
    static let clientID = "com.example.app"
    /// A second client ID of the same team (a secret minted for one is not the other's).
    static let otherClientID = "com.example.web"
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    /// One RSA key for every test (making one takes a while): the local key of `keys generate`.
    static let signer = try! AppleStyleSigner.generate()

    let service: AppleAuthStandIn
    let task: Task<Void, any Error>
    let url: URL
    let clock: MovableClock
    let secrets: TestClientSecrets
    /// The recipient team's key: an app transfer's target.
    let recipient: TestClientSecrets

    static func run<T>(
        limits: AuthLedger.Limits = AuthLedger.Limits(), maximumBodySize: Int = 16 * 1024, transferSeed: [UInt8]? = nil,
        _ body: (StandIn) async throws -> T
    ) async throws -> T {
        let clock = MovableClock(start)
        let secrets = TestClientSecrets()
        let recipient = TestClientSecrets(teamID: "TEAMB00002", keyID: "KEYB000002")
        var configuration = AppleAuthStandIn.Configuration(
            teams: [team(secrets), StandInTeam(teamID: recipient.teamID, keys: [recipient.keyID: recipient.key.publicKey], clientIDs: [clientID])],
            signer: signer)
        configuration.transferSeed = transferSeed
        configuration.limits = limits
        configuration.maximumBodySize = maximumBodySize
        configuration.now = { clock.now }
        let service = AppleAuthStandIn(configuration, logger: Logger(label: "standin", factory: { _ in SwiftLogNoOpLogHandler() }))
        let task = Task { try await service.run() }
        do {
            let result = try await body(StandIn(service: service, task: task, url: try await service.url, clock: clock, secrets: secrets, recipient: recipient))
            task.cancel()
            _ = await task.result
            return result
        } catch {
            task.cancel()
            _ = await task.result
            throw error
        }
    }

    /// The stand-in's team: the key of `secrets`, both client IDs.
    static func team(_ secrets: TestClientSecrets) -> StandInTeam {
        StandInTeam(teamID: secrets.teamID, keys: [secrets.keyID: secrets.key.publicKey], clientIDs: [clientID, otherClientID])
    }

    /// A good client secret for `clientID` at the stand-in's time: issued a minute ago, for an hour.
    func secret(for clientID: String = StandIn.clientID) throws -> String {
        try secrets.secret(clientID: clientID, issuedAt: clock.now.addingTimeInterval(-60))
    }

    func code(sub: String = "001.test.1", email: String? = nil, isPrivateEmail: Bool? = nil, nonce: String? = nil, redirectURI: String? = nil, clientID: String = StandIn.clientID) -> String {
        service.issueCode(.init(clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, nonce: nonce, redirectURI: redirectURI))
    }

    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: String
        var json: JSONValue? { JSONValue.parse(Data(body.utf8)) }
        /// Apple's error answer: the word, when this is exactly one (400, Apple's content type, `{"error": word}`).
        var appleError: AppleAuthError? {
            guard status == 400, headers.first(name: "content-type") == "application/json;charset=UTF-8",
                let object = json?.objectValue, object.count == 1
            else { return nil }
            return object["error"]?.stringValue.flatMap(AppleAuthError.init(word:))
        }
    }

    /// POSTs `form` (name, value pairs, in order) form-encoded to `path`, with `authorization` if given.
    func post(_ path: String, form: [(String, String)], authorization: String? = nil) async throws -> Answer {
        try await post(path, body: Self.encode(form), contentType: "application/x-www-form-urlencoded", authorization: authorization)
    }

    /// `host`: the `Host` header to send instead of the URL's (another name for this address).
    func post(_ path: String, body: String, contentType: String?, authorization: String? = nil, host: String? = nil) async throws -> Answer {
        var request = HTTPClientRequest(url: url.appendingPathComponent(path).absoluteString)
        request.method = .POST
        if let host { request.headers.replaceOrAdd(name: "Host", value: host) }
        if let contentType { request.headers.add(name: "Content-Type", value: contentType) }
        if let authorization { request.headers.add(name: "Authorization", value: authorization) }
        request.body = .bytes(ByteBuffer(string: body))
        return try await send(request)
    }

    func get(_ path: String, host: String? = nil) async throws -> Answer {
        var request = HTTPClientRequest(url: url.appendingPathComponent(path).absoluteString)
        if let host { request.headers.replaceOrAdd(name: "Host", value: host) }
        return try await send(request)
    }

    private func send(_ request: HTTPClientRequest) async throws -> Answer {
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let body = try await response.body.collect(upTo: 1 << 22)
        return Answer(status: Int(response.status.code), headers: response.headers, body: String(buffer: body))
    }

    /// A code exchange with a good secret unless one is given.
    func exchange(_ code: String, secret: String? = nil, clientID: String = StandIn.clientID, redirectURI: String? = nil) async throws -> Answer {
        var form = [
            ("grant_type", "authorization_code"), ("client_id", clientID), ("client_secret", try secret ?? self.secret(for: clientID)),
            ("code", code),
        ]
        if let redirectURI { form.append(("redirect_uri", redirectURI)) }
        return try await post("auth/token", form: form)
    }

    func refresh(_ refreshToken: String, clientID: String = StandIn.clientID) async throws -> Answer {
        try await post(
            "auth/token",
            form: [("grant_type", "refresh_token"), ("client_id", clientID), ("client_secret", try secret(for: clientID)), ("refresh_token", refreshToken)])
    }

    func revoke(_ token: String, hint: String? = "refresh_token", secret: String? = nil, clientID: String = StandIn.clientID) async throws -> Answer {
        var form = [("client_id", clientID), ("client_secret", try secret ?? self.secret(for: clientID)), ("token", token)]
        if let hint { form.append(("token_type_hint", hint)) }
        return try await post("auth/revoke", form: form)
    }

    /// A good client secret of `team` (the sender's by default) for `clientID`.
    func secret(of team: TestClientSecrets, for clientID: String = StandIn.clientID) throws -> String {
        try team.secret(clientID: clientID, issuedAt: clock.now.addingTimeInterval(-60))
    }

    /// `grant_type=client_credentials` for `team`, with `scope` (TN3159's unless given).
    func migrationToken(_ team: TestClientSecrets, scope: String = "user.migration", clientID: String = StandIn.clientID) async throws -> Answer {
        try await post(
            "auth/token",
            form: [("grant_type", "client_credentials"), ("scope", scope), ("client_id", clientID), ("client_secret", try secret(of: team, for: clientID))])
    }

    /// A live migration access token of `team` (fails the test when none is issued).
    func bearer(_ team: TestClientSecrets) async throws -> String {
        let answer = try await migrationToken(team)
        return try #require(answer.json?["access_token"]?.stringValue, "\(answer.status) \(answer.body)")
    }

    /// The sending side: `sub` for `target`, as `team` (the sender's by default) with `bearer`.
    func transferSub(_ sub: String, target: String, as team: TestClientSecrets? = nil, bearer: String?) async throws -> Answer {
        let team = team ?? secrets
        return try await post(
            "auth/usermigrationinfo", form: [("sub", sub), ("target", target), ("client_id", StandIn.clientID), ("client_secret", try secret(of: team))],
            authorization: bearer.map { "Bearer \($0)" })
    }

    /// The receiving side: the user behind `transferSub`, as `team` (the recipient's by default) with `bearer`.
    func migratedUser(_ transferSub: String, as team: TestClientSecrets? = nil, bearer: String?) async throws -> Answer {
        let team = team ?? recipient
        return try await post(
            "auth/usermigrationinfo", form: [("transfer_sub", transferSub), ("client_id", StandIn.clientID), ("client_secret", try secret(of: team))],
            authorization: bearer.map { "Bearer \($0)" })
    }

    static func encode(_ form: [(String, String)]) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)...Unicode.Scalar(127)))
        allowed.insert(charactersIn: "-._~")
        return form.map { "\($0.addingPercentEncoding(withAllowedCharacters: allowed)!)=\($1.addingPercentEncoding(withAllowedCharacters: allowed)!)" }
            .joined(separator: "&")
    }
}
