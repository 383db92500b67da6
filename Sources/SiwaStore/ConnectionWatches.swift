import PostgresNIO
import Synchronization

/// The calls running on each pooled connection, failed when it closes. postgres-nio 1.33 can drop
/// a statement in flight on a closing connection; a call waiting for it would wait out its whole
/// limit (an effect batch held a minute after a failover, and with it a worker). One close
/// callback per connection, however many calls it serves; a call's watch is removed when it ends.
final class ConnectionWatches: Sendable {
    static let shared = ConnectionWatches()

    struct Token: Sendable {
        fileprivate let connection: ObjectIdentifier
        fileprivate let id: Int
    }

    private struct State {
        var nextID = 0
        /// Per connection seen open, its running calls' close handlers (kept, maybe empty, until
        /// it closes, so its one callback is registered once).
        var calls: [ObjectIdentifier: [Int: @Sendable () -> Void]] = [:]
    }
    private let state = Mutex(State())

    /// Runs `closed` when `connection` closes (at once if it has); nil when it already had.
    func watch(_ connection: PostgresConnection, closed: @escaping @Sendable () -> Void) -> Token? {
        let key = ObjectIdentifier(connection)
        let (token, first) = state.withLock { state -> (Token, Bool) in
            state.nextID += 1
            let first = state.calls[key] == nil
            state.calls[key, default: [:]][state.nextID] = closed
            return (Token(connection: key, id: state.nextID), first)
        }
        if first {
            connection.closeFuture.whenComplete { _ in
                let calls = self.state.withLock { $0.calls.removeValue(forKey: key) } ?? [:]
                for call in calls.values { call() }
            }
        }
        if connection.isClosed {
            unwatch(token)
            closed()
            return nil
        }
        return token
    }

    func unwatch(_ token: Token) {
        state.withLock { state in _ = state.calls[token.connection]?.removeValue(forKey: token.id) }
    }
}
