import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import PostgresNIO
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// `Authorization: Bearer <token>` on every route behind it: 401 `unauthorized` without a live
/// token (missing, malformed, unknown, expired and revoked alike, so a caller learns nothing about
/// other tokens); the token's scopes are then checked per route (`require`).
package struct BearerAuthMiddleware: RouterMiddleware {
    package typealias Context = SiwaRequestContext
    let tokens: TokenStore
    let databaseTimeout: Duration

    package init(tokens: TokenStore, databaseTimeout: Duration) {
        self.tokens = tokens
        self.databaseTimeout = databaseTimeout
    }

    package func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let header = request.headers[.authorization] else {
            throw APIError(.unauthorized, code: "unauthorized", message: "missing Authorization header: send Authorization: Bearer <token> (siwa-events tokens create)")
        }
        guard header.count > 7, header.prefix(7).lowercased() == "bearer " else {
            throw APIError(.unauthorized, code: "unauthorized", message: "the Authorization header must be Bearer <token>")
        }
        let token = String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        let tokens = self.tokens
        let identity: TokenIdentity?
        do {
            identity = try await withDeadline(databaseTimeout) { try await tokens.authenticate(token) }
        } catch {
            context.logger.warning("token check failed: database unavailable", metadata: ["error": "\(loggable(error))"])
            throw APIError.unavailable("the token cannot be checked right now (database unavailable); retry later", retryAfter: .seconds(5))
        }
        guard let identity else {
            throw APIError(.unauthorized, code: "unauthorized", message: "the token is unknown, expired or revoked")
        }
        var context = context
        context.identity = identity
        context.logger[metadataKey: "token"] = "\(identity.name)"
        return try await next(request, context)
    }
}

extension SiwaRequestContext {
    /// 403 `forbidden`, naming the scope, unless the request's token has it.
    package func require(_ scope: APIScope) throws {
        guard let identity, identity.scopes.allows(scope) else {
            throw APIError(.forbidden, code: "forbidden", message: "this token lacks the \(scope.rawValue) scope")
        }
    }

    /// Email addresses only for tokens that may read accounts (`accounts:read`).
    package var emailVisibility: EmailVisibility {
        identity?.scopes.allows(.accountsRead) == true ? .shown : .withheld
    }

    /// Who is acting, for the audit log.
    package var actor: String { identity.map { "token:\($0.name)" } ?? "anonymous" }
}

/// The last line of every `/v1` route: an error that is not already an API answer is logged with
/// the request id and answered 500 — or 503 when the database could not be reached — with that
/// id and nothing internal; a 5xx answer decided further in gets the id and its log line too.
package struct APIErrorMiddleware: RouterMiddleware {
    package typealias Context = SiwaRequestContext

    package init() {}

    package func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch var error as APIError where error.status.code >= 500 && error.requestID == nil {
            // A 5xx decided further in (the token check found the database down): it gets the
            // request id too, and the one log line that id names.
            error.requestID = context.id
            context.logger.error("request failed", metadata: ["error": "\(error.message)", "status": "\(error.status.code)", "path": "\(request.uri.path)"])
            throw error
        } catch let error as any HTTPResponseError {
            throw error
        } catch {
            let id = context.id
            let serverSide = (error as? PSQLError)?.serverInfo != nil
            context.logger.error("request failed", metadata: ["error": "\(loggable(error))", "path": "\(request.uri.path)"])
            if serverSide {
                throw APIError(.internalServerError, code: "internal", message: "internal error (request id \(id)); it is logged", requestID: id)
            }
            var unavailable = APIError.unavailable("the database is unavailable (request id \(id)); retry later", retryAfter: .seconds(5))
            unavailable.requestID = id
            throw unavailable
        }
    }
}

/// PostgreSQL text cannot hold NUL: a parameter carrying one (`%00`) is refused up front with a
/// 400 naming the problem, instead of failing in the database as a 500.
package struct RejectNULMiddleware: RouterMiddleware {
    package typealias Context = SiwaRequestContext

    package init() {}

    package func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        if request.uri.string.range(of: "%00", options: .caseInsensitive) != nil {
            throw APIError.invalid("parameters must not contain NUL characters (%00)")
        }
        return try await next(request, context)
    }
}
