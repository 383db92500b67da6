import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import SiwaDomain

/// An error answer: `{"error": CODE, "message": text}` plus `reason` for token failures. The
/// error decides its own status (Hummingbird's `HTTPResponseError`), so routes just throw.
package struct APIError: Error, HTTPResponseError, Sendable {
    package var status: HTTPResponse.Status
    package var code: String
    package var message: String
    package var reason: String?
    package var headers: HTTPFields = [:]
    /// 500/503 answers carry the request id, which the log line also has.
    package var requestID: String?

    package init(
        _ status: HTTPResponse.Status, code: String, message: String, reason: String? = nil, headers: HTTPFields = [:], requestID: String? = nil
    ) {
        self.status = status
        self.code = code
        self.message = message
        self.reason = reason
        self.headers = headers
        self.requestID = requestID
    }

    /// 400 `invalid_request`; the message names the field or parameter.
    package static func invalid(_ message: String) -> APIError {
        APIError(.badRequest, code: "invalid_request", message: message)
    }

    package static func notFound(_ message: String) -> APIError {
        APIError(.notFound, code: "not_found", message: message)
    }

    package static func malformed(_ message: String) -> APIError {
        APIError(.badRequest, code: "malformed_request", message: message)
    }

    package static func unavailable(_ message: String, retryAfter: Duration) -> APIError {
        var headers = HTTPFields()
        headers[.retryAfter] = "\(max(1, retryAfter.components.seconds + (retryAfter.components.attoseconds > 0 ? 1 : 0)))"
        return APIError(.serviceUnavailable, code: "unavailable", message: message, headers: headers)
    }

    package static func from(_ error: VerificationError) -> APIError {
        switch error {
        case .malformed(let message):
            .malformed(message)
        case .invalid(let reason, let message):
            APIError(.unauthorized, code: "invalid_token", message: message, reason: reason.rawValue)
        }
    }

    package var body: JSONValue {
        var object: [String: JSONValue] = ["error": .string(code), "message": .string(message)]
        if let reason { object["reason"] = .string(reason) }
        if let requestID { object["request_id"] = .string(requestID) }
        return .object(object)
    }

    package func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers = self.headers
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body.jsonText)))
    }
}

extension Response {
    /// A JSON answer from a `JSONValue`.
    package static func json(_ value: JSONValue, status: HTTPResponse.Status = .ok) -> Response {
        Response(
            status: status, headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(string: value.jsonText)))
    }
}
