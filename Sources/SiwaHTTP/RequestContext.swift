import Hummingbird
import Logging
import NIOCore
import SiwaStore

/// The request context of every route: Hummingbird's core storage plus the socket peer, which
/// the receiver needs for its records (and, through trusted proxies, the client address).
package struct SiwaRequestContext: RequestContext, RemoteAddressRequestContext {
    package var coreContext: CoreRequestContextStorage
    package let remoteAddress: SocketAddress?
    /// The API token that authenticated this request (set by `BearerAuthMiddleware`).
    package var identity: TokenIdentity?

    package init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.remoteAddress = source.channel.remoteAddress
    }

    /// The peer as text: an IP address, or nil (unix socket, unknown).
    package var peerAddress: String? { remoteAddress?.ipAddress }
}
