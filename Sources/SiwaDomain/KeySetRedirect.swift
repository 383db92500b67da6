import Foundation

/// Where the key-set fetch may go next when the server answers with a redirect: only to
/// http(s), never from https down to http (a network attacker could then serve its own keys),
/// and no further than `maximumHops`.
package enum KeySetRedirect {
    package static let maximumHops = 3

    package enum Refusal: Error, Equatable, CustomStringConvertible {
        case downgrade(to: String)
        case scheme(String)
        case noLocation
        case tooMany(Int)

        package var description: String {
            switch self {
            case .downgrade(let target): "refused a redirect from https to \(URLRedaction.scrubbed(target)): the key set is fetched over https only"
            case .scheme(let target): "refused a redirect to \(URLRedaction.scrubbed(target)): only http(s) is followed"
            case .noLocation: "a redirect without a usable Location header"
            case .tooMany(let hops): "more than \(hops) redirects"
            }
        }
    }

    /// The URL to fetch next, `location` resolved against `current`.
    package static func next(from current: URL, location: String?, hop: Int) throws(Refusal) -> URL {
        guard hop <= maximumHops else { throw .tooMany(maximumHops) }
        guard let location, let target = URL(string: location, relativeTo: current)?.absoluteURL else { throw .noLocation }
        let scheme = target.scheme?.lowercased() ?? ""
        guard scheme == "https" || scheme == "http" else { throw .scheme(target.absoluteString) }
        if current.scheme?.lowercased() == "https" && scheme == "http" { throw .downgrade(to: target.absoluteString) }
        return target
    }
}
