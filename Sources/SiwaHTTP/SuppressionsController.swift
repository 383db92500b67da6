import Foundation
import Hummingbird
import SiwaDomain
import SiwaStore

/// The suppression feed for any sender (`GET /v1/suppressions`, scope `suppressions:read`): each
/// change of an address's state, oldest first, after a cursor. Unlike the other lists, a feed's
/// `next_cursor` is never null: a reader keeps the last one and asks again from it.
package struct SuppressionsController: Sendable {
    let store: SuppressionStore
    /// The configured apps (`SIWA_APPLE_BUNDLE_IDS`): the only ones the feed serves.
    let apps: [String]

    package init(store: SuppressionStore, apps: [String]) {
        self.store = store
        self.apps = apps
    }

    package func register(on group: RouterGroup<SiwaRequestContext>) {
        group.get("suppressions", use: feed)
    }

    @Sendable func feed(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        try context.require(.suppressionsRead)
        let parameters = QueryParameters(request)
        var apps = self.apps
        // A filter, as in the other lists: an app not configured has no changes here.
        if let aud = parameters["aud"].map(String.init) { apps = apps.filter { $0 == aud } }
        var after = 0
        if let text = parameters["after"] {
            guard let cursor = Int(String(text)), cursor >= 0 else {
                throw APIError.invalid("after must be a cursor from this feed (a next_cursor or an item's cursor; 0 from the start), got \(UntrustedText.bounded(String(text), limit: 64))")
            }
            after = cursor
        }
        let limit = try JSONBody.limit(request, default: 100, maximum: ListLimit.maximum)
        let items = try await store.changes(apps: apps, after: after, limit: limit)
        return .json(["items": .array(items.map { $0.json() }), "next_cursor": .string(String(items.last?.cursor ?? after))])
    }
}

extension SuppressionFeedItem {
    /// `email`: a token without the address's scope sees `null` for it (as in the history).
    func json(email: EmailVisibility = .shown) -> JSONValue {
        [
            "cursor": .string(String(cursor)), "aud": .string(aud), "address": email == .shown ? .string(address) : .null, "sub": .string(sub),
            "action": .string(action.rawValue),
            "reason": .string(reason.rawValue), "event_time": .string(iso8601(eventTime)), "recorded_at": .string(iso8601(recordedAt)),
        ]
    }
}

extension SuppressionOperation {
    func json(email: EmailVisibility) -> JSONValue {
        [
            "target": .string(target.rawValue), "address": email == .shown ? .string(address) : .null, "action": .string(action.rawValue),
            "state": .string(state.rawValue), "attempt": .number(Double(attempt)), "created_at": .string(iso8601(createdAt)),
            "finished_at": finishedAt.map { .string(iso8601($0)) } ?? .null, "last_error": lastError.map(JSONValue.string) ?? .null,
        ]
    }
}
