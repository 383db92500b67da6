import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO

/// One connection attempt to `DATABASE_URL` before anything else uses it, so that a wrong URL is
/// named at once instead of the pool retrying it forever: is the database there, does it let us
/// in, and if not, can waiting help?
package enum DatabaseProbe {
    package enum Outcome: Sendable, Equatable {
        case reachable
        /// The server answered and refused: authentication, an unknown role or database. Waiting
        /// cannot help; the URL (or the server's grants) must change.
        case refused(String)
        /// No answer, or not now (refused connection, timeout, server starting): may heal.
        case unreachable(String)
    }

    /// Connects once (within `timeout`) and closes; with several hosts, tries them in order: the
    /// first that lets us in is enough, and a refusal (which no other host would answer
    /// differently) is told at once.
    package static func probe(_ url: String, timeout: Duration, logger: Logger) async -> Outcome {
        let configurations: [PostgresConnection.Configuration]
        do {
            configurations = try DatabaseURL.connectionConfigurations(url, connectTimeout: timeout)
        } catch {
            return .refused("\(error)")
        }
        var reasons: [String] = []
        for configuration in configurations {
            switch await probe(configuration, logger: logger) {
            case .reachable: return .reachable
            case .refused(let reason): return .refused(reason)
            case .unreachable(let reason): reasons.append(configurations.count > 1 ? "\(configuration.host ?? "?"): \(reason)" : reason)
            }
        }
        return .unreachable(reasons.joined(separator: "; "))
    }

    static func probe(_ configuration: PostgresConnection.Configuration, logger: Logger) async -> Outcome {
        do {
            let connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
            try? await connection.close()
            return .reachable
        } catch let error as PSQLError {
            return outcome(error)
        } catch {
            return .unreachable("\(error)")
        }
    }

    /// SQLSTATE classes that mean "not with these credentials or this name": 28 (invalid
    /// authorization: bad password, unknown role, pg_hba), 3D (unknown database), 42 (no privilege).
    static let refusingClasses: Set<Substring> = ["28", "3D", "42"]

    static func outcome(_ error: PSQLError) -> Outcome {
        switch error.code {
        case .server:
            let state = error.serverInfo?[.sqlState] ?? "?"
            let message = error.serverInfo?[.message] ?? "the server refused the connection"
            let text = "\(message) (SQLSTATE \(state))"
            return refusingClasses.contains(state.prefix(2)) ? .refused(text) : .unreachable(text)
        case .unsupportedAuthMechanism, .authMechanismRequiresPassword, .saslError, .sslUnsupported:
            return .refused(error.underlying.map { "\(error.code): \($0)" } ?? "\(error.code)")
        case .connectionError:
            return .unreachable(error.underlying.map(reason) ?? "cannot connect")
        default:
            return .unreachable(error.underlying.map(reason) ?? "\(error.code)")
        }
    }

    /// The cause in a few words: "connection refused", "no answer within 5 s", else the error.
    static func reason(_ error: any Error) -> String {
        if let channel = error as? ChannelError, case .connectTimeout(let amount) = channel {
            return "no answer within \(amount.nanoseconds / 1_000_000) ms"
        }
        if let io = error as? IOError { return "\(String(cString: strerror(io.errnoCode)).lowercased()) (errno \(io.errnoCode))" }
        if let connection = error as? NIOConnectionError, let first = connection.connectionErrors.first {
            return reason(first.error)
        }
        return "\(error)"
    }
}
