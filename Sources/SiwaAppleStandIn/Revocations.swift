import Foundation
import SiwaDomain

/// What a revocation request did. Apple answers 200 to all the first four alike.
package enum RevocationOutcome: Sendable, Equatable {
    /// A token the stand-in issued to this client: its grant is now revoked.
    case revoked
    case alreadyRevoked
    /// Nothing the stand-in issued (a typo, an id_token, the wrong parameter).
    case unknownToken
    /// A token issued to another client: left alone.
    case otherClient
    /// Answered 400 with this error word.
    case refused(AppleAuthError)
    /// Answered by the failure switch with this status.
    case injectedFailure(status: Int)

    /// The word for this outcome in `/standin/revocations`.
    package var word: String {
        switch self {
        case .revoked: "revoked"
        case .alreadyRevoked: "already_revoked"
        case .unknownToken: "unknown_token"
        case .otherClient: "other_client"
        case .refused: "refused"
        case .injectedFailure: "injected_failure"
        }
    }
}

/// One `/auth/revoke` request as it was sent (200 proves nothing, so tests read what arrived).
package struct RevocationRecord: Sendable, Equatable {
    package var clientID: String?
    package var tokenTypeHint: String?
    package var token: String?
    package var receivedAt: Date
    package var status: Int
    package var outcome: RevocationOutcome

    package init(clientID: String?, tokenTypeHint: String?, token: String?, receivedAt: Date, status: Int, outcome: RevocationOutcome) {
        self.clientID = clientID
        self.tokenTypeHint = tokenTypeHint
        self.token = token
        self.receivedAt = receivedAt
        self.status = status
        self.outcome = outcome
    }

    package var json: JSONValue {
        var object: [String: JSONValue] = [
            "client_id": clientID.map(JSONValue.string) ?? .null, "token_type_hint": tokenTypeHint.map(JSONValue.string) ?? .null,
            "token": token.map(JSONValue.string) ?? .null, "received_at": .string(receivedAt.formatted(.iso8601)),
            "status": .number(Double(status)), "outcome": .string(outcome.word),
        ]
        if case .refused(let error) = outcome, let word = error.word { object["error"] = .string(word) }
        return .object(object)
    }
}
