import Foundation

/// The four things Apple tells an app about a Sign in with Apple user.
package enum EventType: String, Sendable, CaseIterable, Codable {
    /// The user turned off email forwarding to their private relay address: stop emailing it.
    case emailDisabled = "email-disabled"
    /// The user turned forwarding back on.
    case emailEnabled = "email-enabled"
    /// The user stopped using Sign in with Apple with the app: sign them out.
    case consentRevoked = "consent-revoked"
    /// The user deleted their Apple ID. Apple's current article spells it `account-deleted`; every
    /// real token seen says `account-delete`. Both map here; the raw spelling is kept beside it.
    case accountDelete = "account-delete"

    /// The canonical type for a raw `type` string, accepting both spellings of the deletion event.
    package init?(apple raw: String) {
        if raw == "account-deleted" {
            self = .accountDelete
        } else {
            self.init(rawValue: raw)
        }
    }

    /// The events that end the user's sessions; they carry no email address.
    package static let revoking: [EventType] = [.consentRevoked, .accountDelete]
}

/// Processing status of a stored notification; one vocabulary for API, CLI and metrics.
package enum ProcessingStatus: String, Sendable, CaseIterable, Codable {
    case pending, applied, skipped, retrying, discarded

    /// Its effect may still run: history keeps such a notification past its retention.
    package static let open: [ProcessingStatus] = [.pending, .retrying]
}

/// Why a genuine notification has nothing to apply.
package enum SkipReason: String, Sendable, Codable {
    /// `events` is not JSON, or lacks `type` or `sub`.
    case unreadableEvent = "unreadable_event"
    /// A `type` Apple may add later. Stored and counted, so it can be handled once understood.
    case unknownType = "unknown_type"
}

/// A decoded event, normalised: canonical type, time in milliseconds.
package struct AppleEvent: Sendable, Equatable {
    package var rawType: String
    package var type: EventType?
    package var sub: String
    /// Milliseconds since 1970, whatever unit Apple used.
    package var eventTimeMillis: Int64
    package var email: String?
    package var isPrivateEmail: Bool?

    package init(rawType: String, type: EventType?, sub: String, eventTimeMillis: Int64, email: String? = nil, isPrivateEmail: Bool? = nil) {
        self.rawType = rawType
        self.type = type
        self.sub = sub
        self.eventTimeMillis = eventTimeMillis
        self.email = email
        self.isPrivateEmail = isPrivateEmail
    }

    package var eventTime: Date { Date(timeIntervalSince1970: Double(eventTimeMillis) / 1000) }
}

/// The outcome of reading the `events` claim of a genuine token.
package enum EventDecoding: Sendable, Equatable {
    case event(AppleEvent)
    /// Nothing to apply. `event` holds what could be read (an unknown type still has `sub`/time).
    case skipped(SkipReason, detail: String, event: AppleEvent?)

    package var event: AppleEvent? {
        switch self {
        case .event(let event): event
        case .skipped(_, _, let event): event
        }
    }
}

extension EventDecoding {
    /// Times below this are seconds (Apple's examples); above, milliseconds (every real token).
    /// 10^11 seconds is the year 5138; 10^11 milliseconds is March 1973.
    static let millisecondsThreshold: Double = 100_000_000_000

    /// Reads Apple's `events` claim: a JSON string holding one object (every real token), an object,
    /// or a one-element array. `iat` supplies the time when `event_time` is missing.
    package static func decode(events: JSONValue?, issuedAt: Int64) -> EventDecoding {
        let object: [String: JSONValue]
        switch eventObject(events) {
        case .success(let value): object = value
        case .failure(let problem): return .skipped(.unreadableEvent, detail: problem.detail, event: nil)
        }
        guard let rawType = object["type"]?.stringValue, !rawType.isEmpty else {
            return .skipped(.unreadableEvent, detail: "the event has no type", event: nil)
        }
        guard let sub = object["sub"]?.stringValue, !sub.isEmpty else {
            return .skipped(.unreadableEvent, detail: "the event has no sub", event: nil)
        }
        let eventTimeMillis: Int64
        let rawTime: Double? =
            switch object["event_time"] {
            case .number(let value): value
            case .string(let text): Double(text)
            default: nil
            }
        // Milliseconds up to the year 5138; anything else (negative, huge, not a number) is
        // treated as missing rather than trusted.
        if let rawTime, rawTime.isFinite, rawTime >= 0, rawTime < millisecondsThreshold * 1000 {
            eventTimeMillis = rawTime >= millisecondsThreshold ? Int64(rawTime) : Int64(rawTime * 1000)
        } else {
            eventTimeMillis = issuedAt * 1000
        }
        let isPrivateEmail: Bool? =
            switch object["is_private_email"] {
            case .bool(let value): value
            case .string(let text): text.lowercased() == "true" ? true : (text.lowercased() == "false" ? false : nil)
            default: nil
            }
        let event = AppleEvent(
            rawType: rawType,
            type: EventType(apple: rawType),
            sub: sub,
            eventTimeMillis: eventTimeMillis,
            email: object["email"]?.stringValue,
            isPrivateEmail: isPrivateEmail
        )
        guard event.type != nil else {
            return .skipped(.unknownType, detail: "unknown event type \"\(rawType)\"", event: event)
        }
        return .event(event)
    }
}

extension EventDecoding {
    /// Why `events` holds no event object.
    package struct Unreadable: Error, Equatable {
        package var detail: String
    }

    /// The one event object of Apple's `events` claim, however it is wrapped.
    static func eventObject(_ events: JSONValue?) -> Result<[String: JSONValue], Unreadable> {
        switch events {
        case .string(let text):
            guard let inner = JSONValue.parse(Data(text.utf8)) else {
                return .failure(Unreadable(detail: "events is a string that does not hold JSON"))
            }
            if case .string = inner {
                return .failure(Unreadable(detail: "events is a string holding a string, not an object"))
            }
            return eventObject(inner)
        case .object(let value):
            return .success(value)
        case .array(let values):
            guard values.count == 1, case .object(let value) = values[0] else {
                return .failure(Unreadable(detail: "events is an array of \(values.count) elements; expected one object"))
            }
            return .success(value)
        case nil, .null:
            return .failure(Unreadable(detail: "the events claim is missing"))
        case .bool, .number:
            return .failure(Unreadable(detail: "events is neither an object nor a string holding one"))
        }
    }

    /// The event's `sub` whenever one can be read, even from an event skipped for another reason
    /// (no `type`): every stored row that may hold an address names its user, so erasure finds it.
    package static func subject(of events: JSONValue?) -> String? {
        guard case .success(let object) = eventObject(events), let sub = object["sub"]?.stringValue, !sub.isEmpty else { return nil }
        return sub
    }
}

