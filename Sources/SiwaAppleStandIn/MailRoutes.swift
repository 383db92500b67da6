import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import SiwaDomain
import Synchronization

/// The mail providers' suppression APIs, as each documents them, under `/<provider>` (so each
/// provider's base URL is `http://127.0.0.1:8090/<provider>`): Postmark, SendGrid, Mailgun, Resend
/// and SES v2 (its SigV4 signature checked). Each request's method, path, headers and body are
/// checked byte for byte against the documented shape and kept (`GET /standin/mail`); a request
/// of another shape is answered as the provider answers one (400/401/415) and changes nothing.
extension AppleAuthStandIn {
    private enum Operation { case suppress(String), lift(String) }
    private struct Refusal: Error { var status: Int; var message: String }

    func addMailRoutes(to router: Router<BasicRequestContext>) {
        router.post("/postmark/message-streams/:stream/suppressions") { request, context in
            await self.mail(.postmark, request, context) { r in try Self.postmark(r, context, lift: false) }
        }
        router.post("/postmark/message-streams/:stream/suppressions/delete") { request, context in
            await self.mail(.postmark, request, context) { r in try Self.postmark(r, context, lift: true) }
        }
        router.post("/sendgrid/v3/asm/suppressions/global") { request, context in
            await self.mail(.sendgrid, request, context) { r in
                try Self.bearer(r, MailLedger.sendgridKey)
                guard case .array(let list)? = try Self.json(r)["recipient_emails"], list.count == 1, let address = list[0].stringValue else {
                    throw Refusal(status: 400, message: "recipient_emails must be a list of addresses")
                }
                return .suppress(address)
            }
        }
        router.delete("/sendgrid/v3/asm/suppressions/global/:email") { request, context in
            await self.mail(.sendgrid, request, context) { r in
                try Self.bearer(r, MailLedger.sendgridKey)
                return .lift(try Self.parameter(context, "email"))
            }
        }
        router.post("/mailgun/v3/:domain/bounces") { request, context in
            await self.mail(.mailgun, request, context) { r in
                try Self.mailgunAuth(r, context)
                guard case .array(let list) = try Self.jsonValue(r), list.count == 1, let address = list[0]["address"]?.stringValue,
                    list[0]["code"]?.stringValue != nil, list[0]["error"]?.stringValue != nil
                else { throw Refusal(status: 400, message: "a JSON list of {address, code, error} is expected") }
                return .suppress(address)
            }
        }
        router.delete("/mailgun/v3/:domain/bounces/:address") { request, context in
            await self.mail(.mailgun, request, context) { r in
                try Self.mailgunAuth(r, context)
                return .lift(try Self.parameter(context, "address"))
            }
        }
        router.post("/resend/suppressions") { request, context in
            await self.mail(.resend, request, context) { r in
                try Self.bearer(r, MailLedger.resendKey)
                guard let address = try Self.json(r)["email"]?.stringValue else { throw Refusal(status: 422, message: "Missing `email` field.") }
                return .suppress(address)
            }
        }
        router.delete("/resend/suppressions/:email") { request, context in
            await self.mail(.resend, request, context) { r in
                try Self.bearer(r, MailLedger.resendKey)
                return .lift(try Self.parameter(context, "email"))
            }
        }
        router.put("/ses/v2/email/suppression/addresses") { request, context in
            await self.mail(.ses, request, context) { r in
                try Self.sigV4(r)
                let body = try Self.json(r)
                guard let address = body["EmailAddress"]?.stringValue, ["BOUNCE", "COMPLAINT"].contains(body["Reason"]?.stringValue ?? "") else {
                    throw Refusal(status: 400, message: "EmailAddress and Reason (BOUNCE or COMPLAINT) are required")
                }
                return .suppress(address)
            }
        }
        router.delete("/ses/v2/email/suppression/addresses/:address") { request, context in
            await self.mail(.ses, request, context) { r in
                try Self.sigV4(r)
                return .lift(try Self.parameter(context, "address"))
            }
        }
    }

    /// A request read whole: what the checks look at.
    private struct Seen {
        var method: String
        var path: String
        var headers: [String: String]
        var body: String
    }

    private func mail(
        _ provider: SuppressionTarget, _ request: Request, _ context: BasicRequestContext, _ check: (Seen) throws -> Operation
    ) async -> Response {
        let body = (try? await request.body.collect(upTo: configuration.maximumBodySize)).map { String(buffer: $0) } ?? ""
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = field.value }
        headers["host"] = request.head.authority
        let seen = Seen(method: request.method.rawValue, path: request.uri.path, headers: headers, body: body)
        var record = MailLedger.Request(provider: provider, method: seen.method, path: seen.path, headers: headers, body: body, status: 200)
        let answer: (Int, JSONValue, [HTTPField])
        do {
            let operation = try check(seen)
            if let failure = mailLedger.withLock({ $0.nextFailure(provider) }) {
                let extra = failure.retryAfter.map { [HTTPField(name: .retryAfter, value: "\($0)")] } ?? []
                answer = (failure.status, Self.errorBody(provider, "the stand-in's failure switch"), extra)
            } else {
                answer = mailLedger.withLock { ledger in Self.apply(operation, provider, &ledger) }
            }
        } catch let refusal as Refusal {
            record.refused = refusal.message
            answer = (refusal.status, Self.errorBody(provider, refusal.message), [])
        } catch {
            answer = (400, Self.errorBody(provider, "\(error)"), [])
        }
        record.status = answer.0
        mailLedger.withLock { $0.record(record) }
        var fields = HTTPFields([HTTPField(name: .contentType, value: "application/json")] + answer.2)
        if answer.0 == 204 { fields = HTTPFields() }
        return Response(
            status: HTTPResponse.Status(code: answer.0), headers: fields,
            body: answer.0 == 204 ? .init() : .init(byteBuffer: ByteBuffer(string: answer.1.jsonText)))
    }

    /// The provider's success answer (or its not-found answer to a lift it does not hold).
    private static func apply(_ operation: Operation, _ provider: SuppressionTarget, _ ledger: inout MailLedger) -> (Int, JSONValue, [HTTPField]) {
        switch operation {
        case .suppress(let address):
            guard ledger.suppress(address, at: provider) else { return (507, errorBody(provider, "the stand-in's list is full"), []) }
            switch provider {
            case .postmark: return (200, ["Suppressions": .array([.object(["EmailAddress": .string(address), "Status": "Suppressed", "Message": .null])])], [])
            case .sendgrid: return (201, ["recipient_emails": .array([.string(address)])], [])
            case .mailgun: return (200, ["message": "1 addresses have been added to the bounces table"], [])
            case .resend: return (200, ["object": "suppression", "id": .string(UUID().uuidString.lowercased())], [])
            case .ses: return (200, [:], [])
            }
        case .lift(let address):
            let held = ledger.lift(address, at: provider)
            switch provider {
            case .postmark: return (200, ["Suppressions": .array([.object(["EmailAddress": .string(address), "Status": "Deleted", "Message": .null])])], [])
            case .sendgrid: return (204, .null, [])  // 204 whether held or not, as SendGrid answers
            case .mailgun:
                return held ? (200, ["message": "Bounced address has been removed", "address": .string(address)], [])
                    : (404, ["message": "Address not found in bounces table"], [])
            case .resend:
                return held ? (200, ["object": "suppression", "deleted": .bool(true)], []) : (404, ["name": "not_found", "message": "Suppression not found"], [])
            case .ses:
                return held ? (200, [:], []) : (404, ["message": .string("Email address \(address) does not exist on your suppression list.")], [])
            }
        }
    }

    private static func errorBody(_ provider: SuppressionTarget, _ message: String) -> JSONValue {
        switch provider {
        case .postmark: ["ErrorCode": .number(300), "Message": .string(message)]
        case .sendgrid: ["errors": .array([.object(["field": .null, "message": .string(message)])])]
        case .mailgun, .resend, .ses: ["message": .string(message)]
        }
    }

    private static func postmark(_ r: Seen, _ context: BasicRequestContext, lift: Bool) throws -> Operation {
        guard r.headers["x-postmark-server-token"] == MailLedger.postmarkToken else {
            throw Refusal(status: 401, message: "Request does not contain a valid Server token.")
        }
        guard r.headers["accept"] == "application/json" else { throw Refusal(status: 415, message: "Accept must be application/json") }
        guard case .array(let list)? = try json(r)["Suppressions"], list.count == 1, let address = list[0]["EmailAddress"]?.stringValue else {
            throw Refusal(status: 422, message: "Suppressions must list {EmailAddress}")
        }
        return lift ? .lift(address) : .suppress(address)
    }

    private static func bearer(_ r: Seen, _ key: String) throws {
        guard r.headers["authorization"] == "Bearer \(key)" else { throw Refusal(status: 401, message: "authorization required") }
    }

    private static func mailgunAuth(_ r: Seen, _ context: BasicRequestContext) throws {
        guard r.headers["authorization"] == "Basic " + Data("api:\(MailLedger.mailgunKey)".utf8).base64EncodedString() else {
            throw Refusal(status: 401, message: "Forbidden")
        }
        guard context.parameters.get("domain") == MailLedger.mailgunDomain else { throw Refusal(status: 404, message: "Domain not found") }
    }

    /// The SigV4 signature recomputed with the stand-in's secret over the headers it names.
    private static func sigV4(_ r: Seen) throws {
        guard let authorization = r.headers["authorization"], let date = r.headers["x-amz-date"],
            let signedPart = authorization.split(separator: " ").first(where: { $0.hasPrefix("SignedHeaders=") })
        else { throw Refusal(status: 403, message: "Missing Authentication Token") }
        let names = signedPart.dropFirst("SignedHeaders=".count).trimmingCharacters(in: CharacterSet(charactersIn: ",")).split(separator: ";").map(String.init)
        guard names.contains("host"), names.contains("x-amz-date") else { throw Refusal(status: 403, message: "host and x-amz-date must be signed") }
        let signer = AWSSignatureV4(
            accessKeyID: MailLedger.awsAccessKeyID, secretAccessKey: MailLedger.awsSecretAccessKey, region: MailLedger.sesRegion, service: "ses")
        let expected = signer.authorization(
            method: r.method, path: r.path, query: [], headers: names.map { ($0, r.headers[$0] ?? "") }, payload: Array(r.body.utf8), amzDate: date)
        guard expected == authorization else {
            throw Refusal(status: 403, message: "The request signature we calculated does not match the signature you provided.")
        }
    }

    private static func parameter(_ context: BasicRequestContext, _ name: String) throws -> String {
        guard let raw = context.parameters.get(name), let address = raw.removingPercentEncoding, !address.isEmpty else {
            throw Refusal(status: 400, message: "\(name) is missing")
        }
        return address
    }

    private static func jsonValue(_ r: Seen) throws -> JSONValue {
        guard r.headers["content-type"] == "application/json" else { throw Refusal(status: 415, message: "Content-Type must be application/json") }
        guard let value = JSONValue.parse(Array(r.body.utf8)) else { throw Refusal(status: 400, message: "the body is not JSON") }
        return value
    }

    private static func json(_ r: Seen) throws -> JSONValue { try jsonValue(r) }
}
