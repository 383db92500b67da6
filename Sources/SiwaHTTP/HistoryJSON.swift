import Foundation
import SiwaDomain
import SiwaStore

// The history records as the API and the CLI's `--json` show them: the wire shapes, kept out of
// the store that reads the rows.

private func time(_ date: Date?) -> JSONValue { date.map { .string(iso8601($0)) } ?? .null }

extension NotificationRecord {
    /// With the address (the CLI, and API tokens with `accounts:read`).
    package var json: JSONValue { json(email: .shown) }

    /// `email: .withheld` answers `"email": null, "email_withheld": true`: the address is personal
    /// data, for tokens allowed to read accounts only.
    package func json(email visibility: EmailVisibility) -> JSONValue {
        [
            "jti": .string(jti), "aud": .string(aud), "sub": sub.map(JSONValue.string) ?? .null, "type": type.map(JSONValue.string) ?? .null,
            "raw_type": rawType.map(JSONValue.string) ?? .null, "status": .string(status), "skip_reason": skipReason.map(JSONValue.string) ?? .null,
            "event_time": time(eventTime), "received_at": .string(iso8601(receivedAt)), "deliveries": .number(Double(deliveries)),
            "email": visibility == .shown ? email.map(JSONValue.string) ?? .null : .null,
            "email_withheld": .bool(visibility == .withheld),
            "is_private_email": isPrivateEmail.map(JSONValue.bool) ?? .null, "erased_at": time(erasedAt),
        ]
    }
}

/// Whether a history answer carries email addresses.
package enum EmailVisibility: Sendable {
    case shown
    case withheld
}

extension AttemptRecord {
    package var json: JSONValue {
        [
            "lane": .string(lane.rawValue), "attempt": .number(Double(attempt)), "worker": .string(worker), "started_at": .string(iso8601(startedAt)),
            "finished_at": .string(iso8601(finishedAt)), "outcome": .string(outcome.rawValue), "error": error.map(JSONValue.string) ?? .null,
            "effect": effect.map(JSONValue.string) ?? .null, "revoked_sessions": revokedSessions.map { .number(Double($0)) } ?? .null,
            "http_status": httpStatus.map { .number(Double($0)) } ?? .null,
        ]
    }
}

extension NotificationDetail {
    package var json: JSONValue { json(email: .shown) }

    package func json(email visibility: EmailVisibility) -> JSONValue {
        var object = record.json(email: visibility).objectValue ?? [:]
        object["verification"] = [
            "kid": .string(kid), "alg": algorithm.map(JSONValue.string) ?? .null, "iss": issuer.map(JSONValue.string) ?? .null,
            "iat": .string(iso8601(issuedAt)), "exp": time(expiresAt), "jti_derived": .bool(jtiDerived),
            "remote_addr": remoteAddress.map(JSONValue.string) ?? .null, "sub": signedSub.map(JSONValue.string) ?? .null,
        ]
        object["last_delivery_at"] = .string(iso8601(lastDeliveryAt))
        object["attempts"] = .array(attempts.map(\.json))
        // The id the backend saw on its callback (and `callbacks redeliver` takes), once one was sent.
        object["webhook_id"] = attempts.contains { $0.lane == .callbacks } ? .string(JobQueue.webhookID(notificationID: record.id)) : .null
        object["jobs"] = .array(jobs.map(\.json))
        return .object(object)
    }
}

extension NotificationJob {
    package var json: JSONValue {
        [
            "id": .number(Double(id)), "lane": .string(lane.rawValue), "state": .string(state.rawValue), "attempt": .number(Double(attempt)),
            "max_attempts": .number(Double(maxAttempts)), "created_at": .string(iso8601(createdAt)), "run_at": .string(iso8601(runAt)),
            "finished_at": time(finishedAt), "last_status": lastStatus.map { .number(Double($0)) } ?? .null,
            "last_error": lastError.map(JSONValue.string) ?? .null, "webhook_id": webhookID.map(JSONValue.string) ?? .null,
        ]
    }
}

extension TimelineEntry {
    package var json: JSONValue { json(email: .shown) }

    package func json(email visibility: EmailVisibility) -> JSONValue {
        var object = record.json(email: visibility).objectValue ?? [:]
        object["effect"] = effect.map(JSONValue.string) ?? .null
        object["revoked_sessions"] = revokedSessions.map { .number(Double($0)) } ?? .null
        object["applied_at"] = time(appliedAt)
        return .object(object)
    }
}
