import Foundation
import Hummingbird
import SiwaDomain

/// The opaque `next_cursor` of every keyset-paged list: base64url of "<scope>.<µs>.<id>" — the
/// sort time in whole microseconds (the stores compare it in SQL, exactly) and the row's id. The
/// scope names the list and its sort field, so a cursor from one list is refused by another.
struct KeysetCursor {
    var scope: String
    var micros: Int64
    var id: String

    var text: String { Base64URL.encode(Array("\(scope).\(micros).\(id)".utf8)) }

    /// The request's `cursor` parameter for `scope` (nil without one); 400 `invalid_request` with
    /// `message` when it is not a cursor this list handed out.
    static func parameter<ID>(_ request: Request, scope: String, id: (String) -> ID?, message: String) throws -> (micros: Int64, id: ID)? {
        guard let text = QueryParameters(request)["cursor"] else { return nil }
        guard let data = Base64URL.decode(text), let decoded = String(data: data, encoding: .utf8) else { throw APIError.invalid(message) }
        let parts = decoded.split(separator: ".", maxSplits: 2)
        guard parts.count == 3, parts[0] == scope, let micros = Int64(parts[1]), let value = id(String(parts[2])) else {
            throw APIError.invalid(message)
        }
        return (micros, value)
    }

    /// One page from the `limit + 1` rows a store returned: the first `limit`, and the cursor
    /// after the last of them when there are more.
    static func page<Row>(_ rows: [Row], limit: Int, scope: String, position: (Row) -> (micros: Int64, id: String)) -> (items: ArraySlice<Row>, next: JSONValue) {
        let items = rows.prefix(limit)
        guard rows.count > limit, let last = items.last else { return (items, .null) }
        let (micros, id) = position(last)
        return (items, .string(KeysetCursor(scope: scope, micros: micros, id: id).text))
    }
}
