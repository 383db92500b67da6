import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import SiwaDomain
import Synchronization

/// The stand-in's own endpoints, for tests and for a user trying it: `POST /standin/codes` (a code,
/// as Apple gives a device at sign-in), `GET /standin/revocations` (what `/auth/revoke` was sent),
/// `POST /standin/failures` (the failure switch), `POST /standin/users` (a user's app-transfer
/// marks: `{sub, is_private_email?, revoked?}`), `GET /standin/mail` (the mail providers'
/// suppression lists and the requests they were sent), `POST /standin/mail/failures`. No credential guards them, so they answer only
/// this machine (`ControlRouteGuard`): a loopback `Host`, JSON bodies.
extension AppleAuthStandIn {
    func addControlRoutes(to router: Router<BasicRequestContext>) {
        let control = router.group("/standin").add(middleware: ControlRouteGuard())
        control.post("codes") { request, _ -> Response in
            do throws(ControlError) {
                let fields = try await self.readFields(request)
                let authorization = try Self.authorization(fields, clientIDs: Set(self.configuration.teams.flatMap(\.clientIDs)))
                let code = self.issueCode(authorization)
                return AppleAnswer.json(["code": .string(code), "expires_in": .number(self.configuration.limits.codeLifetime)])
            } catch {
                return error.response
            }
        }
        control.post("users") { request, _ -> Response in
            do throws(ControlError) {
                let fields = try await self.readFields(request)
                guard let sub = fields["sub"]?.stringValue, !sub.isEmpty, sub.utf8.count <= TransferSubs.maximumSubLength else {
                    throw ControlError("sub is required: the user's Apple ID in the sending team, at most \(TransferSubs.maximumSubLength) bytes")
                }
                let user = AuthLedger.MigrationUser(
                    sub: sub, isPrivateEmail: try Self.flag(fields, "is_private_email") ?? false, revoked: try Self.flag(fields, "revoked") ?? false)
                self.markUser(user)
                return AppleAnswer.json(["sub": .string(sub), "is_private_email": .bool(user.isPrivateEmail), "revoked": .bool(user.revoked)])
            } catch {
                return error.response
            }
        }
        control.get("revocations") { _, _ -> Response in
            AppleAnswer.json(["revocations": .array(self.revocations.map(\.json))])
        }
        control.get("mail") { _, _ -> Response in
            let (lists, requests) = self.mailLedger.withLock { ($0.suppressed, $0.requests) }
            return AppleAnswer.json([
                "suppressed": .object(Dictionary(uniqueKeysWithValues: lists.map { ($0.key.rawValue, .array($0.value.sorted().map { .string($0) })) })),
                "requests": .array(requests.map(\.json)),
            ])
        }
        control.post("mail/failures") { request, _ -> Response in
            do throws(ControlError) {
                let fields = try await self.readFields(request)
                guard let provider = fields["provider"]?.stringValue.flatMap(SuppressionTarget.init(rawValue:)) else {
                    throw ControlError("provider must be one of postmark, sendgrid, mailgun, resend, ses")
                }
                guard let status = Self.integer(fields["status"]), (100...599).contains(status) else {
                    throw ControlError("status must be an HTTP status, e.g. 503")
                }
                let count = fields["count"] == nil ? 1 : Self.integer(fields["count"]) ?? -1
                guard count >= 0 else { throw ControlError("count must be a whole number of requests (0 turns the switch off)") }
                self.mailLedger.withLock { $0.failNext(count, of: provider, status: status, retryAfter: Self.integer(fields["retry_after"])) }
                return Response(status: .noContent)
            } catch {
                return error.response
            }
        }
        control.post("failures") { request, _ -> Response in
            do throws(ControlError) {
                let fields = try await self.readFields(request)
                guard let endpoint = fields["endpoint"]?.stringValue.flatMap(StandInEndpoint.init(rawValue:)) else {
                    throw ControlError("endpoint must be one of \(StandInEndpoint.valueNames)")
                }
                guard let status = Self.integer(fields["status"]), (100...599).contains(status) else {
                    throw ControlError("status must be an HTTP status, e.g. 503")
                }
                let count = fields["count"] == nil ? 1 : Self.integer(fields["count"]) ?? -1
                guard count >= 0 else { throw ControlError("count must be a whole number of requests (0 turns the switch off)") }
                self.failNext(count, of: endpoint, status: status)
                return Response(status: .noContent)
            } catch {
                return error.response
            }
        }
    }

    /// The JSON object of the body (`ControlRouteGuard` let only `application/json` through), as name → value.
    private func readFields(_ request: Request) async throws(ControlError) -> [String: JSONValue] {
        guard let body = try? await request.body.collect(upTo: configuration.maximumBodySize),
            let object = JSONValue.parse(body.readableBytesView)?.objectValue
        else { throw ControlError("the body must be a JSON object of at most \(configuration.maximumBodySize) bytes") }
        return object
    }

    private static func authorization(_ fields: [String: JSONValue], clientIDs: Set<String>) throws(ControlError) -> AuthLedger.Authorization {
        func text(_ name: String) throws(ControlError) -> String? {
            guard let value = fields[name], value != .null else { return nil }
            guard let text = value.stringValue, !text.isEmpty else { throw ControlError("\(name) must be a non-empty string") }
            return text
        }
        guard let clientID = try text("client_id"), clientIDs.contains(clientID) else {
            throw ControlError("client_id must be one of the stand-in's client IDs: \(clientIDs.sorted().joined(separator: ", "))")
        }
        guard let sub = try text("sub") else { throw ControlError("sub is required: the user's Apple ID, e.g. 001234.abcdef.0001") }
        let isPrivateEmail = try flag(fields, "is_private_email")
        let email = try text("email")
        if isPrivateEmail != nil && email == nil { throw ControlError("is_private_email needs email (the relay address)") }
        return AuthLedger.Authorization(
            clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, nonce: try text("nonce"),
            redirectURI: try text("redirect_uri"))
    }

    /// A true/false field (a JSON boolean or the word); nil when absent.
    private static func flag(_ fields: [String: JSONValue], _ name: String) throws(ControlError) -> Bool? {
        switch fields[name] {
        case nil, .null?: nil
        case .bool(let flag)?: flag
        case .string("true")?: true
        case .string("false")?: false
        default: throw ControlError("\(name) must be true or false")
        }
    }

    private static func integer(_ value: JSONValue?) -> Int? {
        switch value {
        case .number(let number)?: number.rounded() == number && abs(number) < 1e9 ? Int(number) : nil
        case .string(let text)?: Int(text)
        default: nil
        }
    }
}

/// A refused request to a `/standin` route: 400 with what to change.
struct ControlError: Error {
    let message: String
    init(_ message: String) { self.message = message }

    var response: Response {
        AppleAnswer.json(["error": "invalid_request", "message": .string(message)], status: .badRequest)
    }
}

/// What every `/standin` route checks before it runs. They mint codes, mark users and flip the
/// failure switch with no credential, for this machine's tests and user; a page in a browser here
/// must not reach them:
/// - the `Host` must be a loopback name or address (`LoopbackHost`): a page whose own domain
///   resolves to 127.0.0.1 (DNS rebinding) sends that domain, and gets 421;
/// - a body must be `application/json`, which a page cannot send to another origin without a
///   CORS preflight (the stand-in answers none): a form or `text/plain` POST gets 415.
struct ControlRouteGuard: RouterMiddleware {
    typealias Context = BasicRequestContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let authority = request.head.authority, LoopbackHost.contains(authority: authority) else {
            let host = request.head.authority.map { "Host \(UntrustedText.bounded($0, limit: 128))" } ?? "a request without Host"
            return AppleAnswer.json(
                [
                    "error": "misdirected_request",
                    "message": .string("the /standin routes answer only this machine (Host localhost, 127.0.0.1 or [::1]), not \(host)"),
                ], status: .misdirectedRequest)
        }
        if request.method != .get && request.method != .head && !Self.isJSON(request.headers[.contentType]) {
            return AppleAnswer.json(
                ["error": "unsupported_media_type", "message": "send the body as application/json (Content-Type: application/json)"],
                status: .unsupportedMediaType)
        }
        return try await next(request, context)
    }

    /// Whether a `Content-Type` is `application/json` (parameters such as `charset` allowed).
    static func isJSON(_ contentType: String?) -> Bool {
        guard let mediaType = contentType?.split(separator: ";", maxSplits: 1).first else { return false }
        return mediaType.trimmingCharacters(in: .whitespaces).lowercased() == "application/json"
    }
}
