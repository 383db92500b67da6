import Foundation

/// A mail provider whose suppression list siwa-events keeps in line (`SIWA_SUPPRESSION_TARGETS`).
package enum SuppressionTarget: String, Sendable, CaseIterable, Hashable {
    case postmark, sendgrid, mailgun, resend, ses
}

/// What a change does to an address: stop mailing it, or mail it again.
package enum SuppressionAction: String, Sendable, CaseIterable {
    case suppress, lift
}

/// Why an address is (no longer) suppressed: the event that decided it.
package enum SuppressionReason: String, Sendable, CaseIterable {
    /// Apple: the user turned forwarding to the address off.
    case emailDisabled = "email_disabled"
    /// Apple: the user turned it back on.
    case emailEnabled = "email_enabled"
    /// Apple: the user deleted their Apple ID.
    case accountDeleted = "account_deleted"
    /// Apple: the user stopped using Sign in with Apple with the app (only where the app says so).
    case consentRevoked = "consent_revoked"
    /// A privacy request erased the user's data here.
    case erased

    package var action: SuppressionAction { self == .emailEnabled ? .lift : .suppress }
}

/// One app's address: the key of a suppression.
package struct SuppressionKey: Hashable, Sendable, Comparable {
    package var aud: String
    package var address: String

    /// `address` as providers compare it: trimmed and lowercased.
    package init(aud: String, address: String) {
        self.aud = aud
        self.address = SuppressionRules.normalized(address)
    }

    package static func < (a: Self, b: Self) -> Bool { (a.aud, a.address) < (b.aud, b.address) }
}

/// An address as the rules last left it.
package struct SuppressionState: Sendable, Equatable {
    package var sub: String
    package var suppressed: Bool
    package var reason: SuppressionReason
    /// The event time (ms since 1970) of the event that set it.
    package var eventTime: Int64

    package init(sub: String, suppressed: Bool, reason: SuppressionReason, eventTime: Int64) {
        self.sub = sub
        self.suppressed = suppressed
        self.reason = reason
        self.eventTime = eventTime
    }
}

/// What one event says of one address.
package struct SuppressionEvent: Sendable, Equatable {
    package var key: SuppressionKey
    package var sub: String
    package var reason: SuppressionReason
    package var eventTime: Int64

    package init(key: SuppressionKey, sub: String, reason: SuppressionReason, eventTime: Int64) {
        self.key = key
        self.sub = sub
        self.reason = reason
        self.eventTime = eventTime
    }
}

/// A change of an address's state: a line of the feed, and the operation each target is sent.
package struct SuppressionChange: Sendable, Equatable {
    package var key: SuppressionKey
    package var sub: String
    package var action: SuppressionAction
    package var reason: SuppressionReason
    package var eventTime: Int64

    package init(key: SuppressionKey, sub: String, action: SuppressionAction, reason: SuppressionReason, eventTime: Int64) {
        self.key = key
        self.sub = sub
        self.action = action
        self.reason = reason
        self.eventTime = eventTime
    }
}

/// The suppression rules, pure. An address of an app is suppressed from an `email-disabled` (or the
/// account's deletion or erasure, or `consent-revoked` where the app says so) until a newer
/// `email-enabled` lifts it: each address is a last-writer-wins register on the event time, so a
/// late `email-disabled` never re-suppresses after a newer `email-enabled`, whatever the delivery
/// order. Any address counts, relay (either domain) or not; an event that changes nothing adds
/// no change.
package enum SuppressionRules {
    /// What the settings say beyond Apple's events.
    package struct Policy: Sendable, Equatable {
        /// `consent-revoked` suppresses the user's addresses too (`SIWA_SUPPRESS_ON_CONSENT_REVOKED`).
        package var onConsentRevoked: Bool

        package init(onConsentRevoked: Bool = false) { self.onConsentRevoked = onConsentRevoked }
    }

    package static func normalized(_ address: String) -> String {
        address.trimmingCharacters(in: .whitespacesAndNewlines).lowercased()
    }

    /// Whether `address` can be sent to a provider as an address: one `@`, both sides non-empty,
    /// no spaces or controls, at most 320 bytes. Anything else Apple sent is not a mailbox.
    package static func isAddress(_ address: String) -> Bool {
        let parts = address.split(separator: "@", omittingEmptySubsequences: false)
        return parts.count == 2 && !parts[0].isEmpty && !parts[1].isEmpty && (3...320).contains(address.utf8.count)
            && !address.unicodeScalars.contains { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7F || $0 == "/" }
    }

    /// What one of Apple's events says of the user's addresses: the address it names, else every
    /// address known for the user (`known`: the account's, and those of earlier events).
    package static func events(
        for type: EventType, aud: String, sub: String, email: String?, eventTime: Int64, known: [String], policy: Policy
    ) -> [SuppressionEvent] {
        let reason: SuppressionReason
        switch type {
        case .emailDisabled: reason = .emailDisabled
        case .emailEnabled: reason = .emailEnabled
        case .accountDelete: reason = .accountDeleted
        case .consentRevoked:
            guard policy.onConsentRevoked else { return [] }
            reason = .consentRevoked
        }
        return events(reason: reason, aud: aud, sub: sub, email: email, eventTime: eventTime, known: known)
    }

    /// As above, for a reason of our own (an erasure, at its wall-clock time).
    package static func events(
        reason: SuppressionReason, aud: String, sub: String, email: String?, eventTime: Int64, known: [String]
    ) -> [SuppressionEvent] {
        let named = email.map { [$0] } ?? known
        var seen = Set<SuppressionKey>()
        return named.compactMap { address in
            let key = SuppressionKey(aud: aud, address: address)
            guard isAddress(key.address), seen.insert(key).inserted else { return nil }
            return SuppressionEvent(key: key, sub: sub, reason: reason, eventTime: eventTime)
        }
    }

    /// Applies `events` to `states` in event-time order: the states after, and the changes (in
    /// the order they happened). An event no newer than the address's state changes nothing; a
    /// lift of an address never suppressed records it (so a late, older `email-disabled` stays
    /// ignored) but is no change.
    package static func apply(
        _ events: [SuppressionEvent], to states: [SuppressionKey: SuppressionState]
    ) -> (states: [SuppressionKey: SuppressionState], changes: [SuppressionChange]) {
        var states = states
        var changes: [SuppressionChange] = []
        let ordered = events.enumerated().sorted { ($0.element.eventTime, $0.offset) < ($1.element.eventTime, $1.offset) }.map(\.element)
        for event in ordered {
            let suppressed = event.reason.action == .suppress
            let before = states[event.key]
            if let before, event.eventTime <= before.eventTime { continue }
            states[event.key] = SuppressionState(sub: event.sub, suppressed: suppressed, reason: event.reason, eventTime: event.eventTime)
            if (before?.suppressed ?? false) != suppressed {
                changes.append(
                    SuppressionChange(key: event.key, sub: event.sub, action: event.reason.action, reason: event.reason, eventTime: event.eventTime))
            }
        }
        return (states, changes)
    }
}

extension SuppressionRules {
    /// The suppression changes of an effect batch: each job's event against the addresses known
    /// for its user (`known`: the account's; an address whose state names the user, or that an
    /// event of the batch names, is known too) and the addresses' current `states`.
    package static func plan(
        _ jobs: [EffectJob], known: [AccountKey: [String]], states: [SuppressionKey: SuppressionState], policy: Policy
    ) -> (states: [SuppressionKey: SuppressionState], changes: [SuppressionChange]) {
        var known = known
        // An address whose state names the user is theirs (a row an earlier event left).
        for (key, state) in states.sorted(by: { $0.key < $1.key }) { known[AccountKey(aud: key.aud, sub: state.sub), default: []].append(key.address) }
        for job in jobs { if let email = job.event.email { known[job.user, default: []].append(email) } }
        let events = jobs.flatMap { job -> [SuppressionEvent] in
            guard let type = job.event.type else { return [] }
            return Self.events(
                for: type, aud: job.aud, sub: job.event.sub, email: job.event.email, eventTime: job.event.eventTimeMillis, known: known[job.user] ?? [],
                policy: policy)
        }
        return apply(events, to: states)
    }
}
