import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import SiwaDomain

/// The stand-in's own endpoints, for tests and for a user trying it: `POST /standin/codes` (a code,
/// as Apple gives a device at sign-in), `GET /standin/revocations` (what `/auth/revoke` was sent),
/// `POST /standin/failures` (the failure switch), `POST /standin/users` (a user's app-transfer
/// marks: `{sub, is_private_email?, revoked?}`). Bodies are JSON or a form.
extension AppleAuthStandIn {
    func addControlRoutes(to router: Router<BasicRequestContext>) {
        router.post("/standin/codes") { request, _ -> Response in
            do throws(ControlError) {
                let fields = try await self.readFields(request)
                let authorization = try Self.authorization(fields, clientIDs: Set(self.configuration.teams.flatMap(\.clientIDs)))
                let code = self.issueCode(authorization)
                return AppleAnswer.json(["code": .string(code), "expires_in": .number(self.configuration.limits.codeLifetime)])
            } catch {
                return error.response
            }
        }
        router.post("/standin/users") { request, _ -> Response in
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
        router.get("/standin/revocations") { _, _ -> Response in
            AppleAnswer.json(["revocations": .array(self.revocations.map(\.json))])
        }
        router.post("/standin/failures") { request, _ -> Response in
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

    /// A JSON object or a form, as name → value (a form's values are strings).
    private func readFields(_ request: Request) async throws(ControlError) -> [String: JSONValue] {
        let contentType = request.headers[.contentType]
        if FormBody.isForm(contentType: contentType) {
            guard let form = await readForm(request) else { throw ControlError("the form is malformed or larger than \(configuration.maximumBodySize) bytes") }
            return form.fields.mapValues(JSONValue.string)
        }
        guard contentType?.lowercased().hasPrefix("application/json") == true else {
            throw ControlError("send application/json or application/x-www-form-urlencoded")
        }
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

    /// A true/false field (a JSON boolean or, from a form, the word); nil when absent.
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
