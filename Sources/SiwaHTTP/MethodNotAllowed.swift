import HTTPTypes
import Hummingbird

/// 405 `method_not_allowed` with `Allow` for every method a registered path does not serve (instead
/// of Hummingbird's 404, which says the path does not exist). Call after every route is registered.
package enum MethodNotAllowed {
    static let methods: [HTTPRequest.Method] = [.get, .head, .post, .put, .patch, .delete, .options, .trace, .connect, HTTPRequest.Method("QUERY")!]

    package static func register(on router: Router<SiwaRequestContext>) {
        let served = Dictionary(grouping: router.routes, by: { $0.path.description }).mapValues { Set($0.map(\.method)) }
        for (path, methods) in served {
            // Hummingbird answers HEAD wherever GET is served.
            let allowed = methods.contains(.get) ? methods.union([.head]) : methods
            let allow = allowed.map(\.rawValue).sorted().joined(separator: ", ")
            for method in Self.methods where !allowed.contains(method) {
                // After CONNECT the HTTP parser treats what follows as a tunnel: close, so the
                // client's next request goes on a new connection instead of waiting unparsed.
                let headers: HTTPFields = method == .connect ? [.allow: allow, .connection: "close"] : [.allow: allow]
                router.on(RouterPath(path), method: method) { _, _ -> Response in
                    throw APIError(
                        .methodNotAllowed, code: "method_not_allowed", message: "\(method.rawValue) is not supported here; use \(allow)",
                        headers: headers)
                }
            }
        }
    }
}

/// A request's query parameters, where a free-text filter left empty (`sub=`, as forms send it)
/// means the same as none; an empty time, number or choice is still refused by its parser.
package struct QueryParameters {
    private let pairs: [(name: Substring, value: Substring)]
    static let freeText: Set<Substring> = ["aud", "sub", "cursor"]

    package init(_ request: Request) {
        pairs = request.uri.queryParameters.compactMap { $0.value.isEmpty && Self.freeText.contains($0.key) ? nil : ($0.key, $0.value) }
    }

    package subscript(_ name: String) -> Substring? { pairs.first { $0.name == name }?.value }

    package func getAll(_ name: String) -> [Substring] { pairs.filter { $0.name == name }.map(\.value) }
}
