import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import SiwaDomain
import SiwaStore

/// The event history for backend teams (`/v1`, scope `notifications:read`).
package struct HistoryController: Sendable {
    let history: HistoryStore
    let rejections: RejectionStore
    /// Where callbacks go (`SIWA_CALLBACK_URL`), without credentials, query or fragment.
    let callbackURL: String?

    package init(history: HistoryStore, rejections: RejectionStore, callbackURL: URL? = nil) {
        self.history = history
        self.rejections = rejections
        self.callbackURL = callbackURL.map(Self.shown)
    }

    /// A URL as the dashboard may show it: a password or token in it stays out.
    static func shown(_ url: URL) -> String {
        guard var parts = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "" }
        parts.user = nil
        parts.password = nil
        parts.query = nil
        parts.fragment = nil
        return parts.string ?? ""
    }

    package func register(on group: RouterGroup<SiwaRequestContext>) {
        group.get("notifications", use: list)
        group.get("notifications/export", use: export)
        group.get("notifications/:jti", use: show)
        group.get("accounts/:aud/:sub/timeline", use: timeline)
        group.get("stats/notifications", use: stats)
        group.get("rejections", use: listRejections)
    }

    /// The `type` parameters as canonical types; 400 naming the valid ones for any other.
    static func types(_ parameters: QueryParameters) throws -> [String] {
        try parameters.getAll("type").map { text in
            guard let type = EventType(apple: String(text)) else {
                throw APIError.invalid("type \(text) is not one of \(EventType.valueNames)")
            }
            return type.rawValue
        }
    }

    /// The filters shared by list and export, from the query string; errors name the parameter.
    static func query(_ request: Request, limit: (default: Int, maximum: Int)) throws -> HistoryQuery {
        let parameters = QueryParameters(request)
        var query = HistoryQuery()
        query.aud = parameters["aud"].map(String.init)
        query.sub = parameters["sub"].map(String.init)
        query.types = try types(parameters)
        query.statuses = try parameters.getAll("status").map { text in
            guard let status = ProcessingStatus(rawValue: String(text)) else {
                throw APIError.invalid("status \(text) is not one of \(ProcessingStatus.valueNames)")
            }
            return status.rawValue
        }
        if let field = parameters["time_field"] {
            guard let timeField = HistoryQuery.TimeField(rawValue: String(field)) else {
                throw APIError.invalid("time_field must be received_at or event_time (got \(field))")
            }
            query.timeField = timeField
        }
        query.from = try date(parameters["from"], name: "from")
        query.to = try date(parameters["to"], name: "to")
        // from >= to is an empty range: nothing matches (answered by the query itself).
        query.limit = try JSONBody.limit(request, default: limit.default, maximum: limit.maximum)
        query.after = try KeysetCursor.parameter(
            request, scope: query.timeField.rawValue, id: { Int($0) },
            message: "cursor is not valid for this query: pass back the next_cursor of the previous page, with the same time_field")
        return query
    }

    static func date(_ text: Substring?, name: String) throws -> Date? {
        guard let text else { return nil }
        guard let date = JSONBody.date(.string(String(text))) else {
            throw APIError.invalid("\(name) must be an ISO-8601 time like 2026-11-21T08:00:00Z (got \(text))")
        }
        return date
    }

    @Sendable func list(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        var query = try Self.query(request, limit: (100, ListLimit.maximum))
        let limit = query.limit
        query.limit = limit + 1
        let rows = try await history.notifications(query)
        let page = KeysetCursor.page(rows, limit: limit, scope: query.timeField.rawValue) { ($0.sortMicros, String($0.id)) }
        let email = context.emailVisibility
        return .json(["items": .array(page.items.map { $0.json(email: email) }), "next_cursor": page.next])
    }

    /// NDJSON, one notification a line, newest first, read in keyset pages of `ListLimit.maximum`
    /// and written as they come: memory stays flat whatever the range.
    @Sendable func export(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        var first = try Self.query(request, limit: (ListLimit.maximum, ListLimit.maximum))
        first.limit = ListLimit.maximum
        // The first page is read before the answer starts, so that a failure is still a proper
        // error status; a failure after that can only cut the stream short.
        let firstPage = try await history.notifications(first)
        let start = first
        let history = self.history
        let email = context.emailVisibility
        let body = ResponseBody { writer in
            var query = start
            var page = firstPage
            while true {
                var buffer = ByteBuffer()
                for record in page {
                    buffer.writeString(record.json(email: email).jsonText)
                    buffer.writeInteger(UInt8(ascii: "\n"))
                }
                if buffer.readableBytes > 0 { try await writer.write(buffer) }
                guard page.count == query.limit, let last = page.last else { break }
                query.after = (last.sortMicros, last.id)
                page = try await history.notifications(query)
            }
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: [.contentType: "application/x-ndjson"], body: body)
    }

    @Sendable func show(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        let jti = context.parameters.get("jti")?.removingPercentEncoding ?? ""
        guard let detail = try await history.notification(jti: jti) else { throw APIError.notFound("no notification with jti \(jti)") }
        var object = detail.json(email: context.emailVisibility).objectValue ?? [:]
        object["callback_url"] = callbackURL.map(JSONValue.string) ?? .null
        return .json(.object(object))
    }

    @Sendable func timeline(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        let (aud, sub) = try BackendController.user(context)
        let limit = try JSONBody.limit(request, default: ListLimit.maximum, maximum: ListLimit.maximum)
        let entries = try await history.timeline(aud: aud, sub: sub, limit: limit)
        let email = context.emailVisibility
        let revocations = try await JobQueue(client: history.client, logger: context.logger).listAppleRevocations(
            failed: false, aud: aud, sub: sub, limit: limit)
        let calls = try await AppleTokenStore(client: history.client, logger: context.logger).calls(aud: aud, sub: sub, limit: limit)
        let suppressions = try await SuppressionStore(client: history.client, logger: context.logger).timeline(aud: aud, sub: sub, limit: limit)
        return .json([
            "aud": .string(aud), "sub": .string(sub), "items": .array(entries.map { $0.json(email: email) }),
            "apple_revocations": .array(revocations.map(\.json)), "apple_calls": .array(calls.map(\.json)),
            "suppressions": .array(suppressions.changes.map { $0.json(email: email) }),
            "suppression_operations": .array(suppressions.operations.map { $0.json(email: email) }),
        ])
    }

    @Sendable func stats(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        let parameters = QueryParameters(request)
        let bucket = parameters["bucket"].map(String.init) ?? "hour"
        guard let size = HistoryStore.buckets[bucket] else { throw APIError.invalid("bucket must be minute, hour or day (got \(bucket))") }
        let to = try Self.date(parameters["to"], name: "to") ?? Date()
        // At most 10,000 buckets, the latest: the answer's `from` says where they start.
        let earliest = to.addingTimeInterval(-10_000 * size.seconds)
        let from = max(try Self.date(parameters["from"], name: "from") ?? to.addingTimeInterval(-size.defaultRange), earliest)
        let types = try Self.types(parameters)
        let rows = try await history.stats(bucket: bucket, from: from, to: to, aud: parameters["aud"].map(String.init), types: types)
        var buckets: [(Date, [String: JSONValue])] = []
        for row in rows {
            if buckets.last?.0 != row.start { buckets.append((row.start, [:])) }
            buckets[buckets.count - 1].1[row.type] = .number(Double(row.count))
        }
        return .json([
            "bucket": .string(bucket), "from": .string(iso8601(from)), "to": .string(iso8601(to)),
            "items": .array(buckets.map { start, counts in
                ["start": .string(iso8601(start)), "counts": .object(counts),
                 "total": .number(counts.values.compactMap(\.numberValue).reduce(0, +))]
            }),
        ])
    }

    @Sendable func listRejections(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.notificationsRead)
        let limit = try JSONBody.limit(request, default: 100, maximum: ListLimit.maximum)
        let reason = QueryParameters(request)["reason"].map(String.init)
        if let reason, RejectionReason(rawValue: reason) == nil {
            throw APIError.invalid("reason must be one of \(RejectionReason.valueNames) (got \(reason))")
        }
        let since = try Self.date(QueryParameters(request)["since"], name: "since") ?? Date().addingTimeInterval(-86_400)
        let after = try KeysetCursor.parameter(
            request, scope: "rejections", id: { Int($0) }, message: "cursor is not valid: pass back the next_cursor of the previous page")
        let rows = try await rejections.list(reason: reason, limit: limit + 1, after: after)
        let page = KeysetCursor.page(rows, limit: limit, scope: "rejections") { ($0.sortMicros, String($0.id)) }
        let counts = try await rejections.counts(since: since)
        return .json([
            "items": .array(page.items.map { item in
                [
                    "id": .number(Double(item.id)), "received_at": .string(iso8601(item.receivedAt)), "reason": .string(item.reason),
                    "message": .string(item.message), "body_size": .number(Double(item.bodySize)), "kid": item.kid.map(JSONValue.string) ?? .null,
                    "aud": item.aud.map(JSONValue.string) ?? .null, "jti": item.jti.map(JSONValue.string) ?? .null,
                    "remote_addr": item.remoteAddress.map(JSONValue.string) ?? .null, "token_kept": .bool(item.hasToken),
                ]
            }),
            "totals_since": .string(iso8601(since)),
            "totals": .array(counts.map { ["reason": .string($0.reason), "recorded": .number(Double($0.recorded)), "sampled_out": .number(Double($0.sampledOut))] }),
            "next_cursor": page.next,
        ])
    }
}
