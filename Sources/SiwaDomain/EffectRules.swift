import Foundation

/// What siwa-events knows about one Sign in with Apple user of one app, as far as Apple's
/// notifications tell. Times are event times (milliseconds since 1970) of the events applied.
package struct AccountState: Sendable, Equatable {
    package enum Forwarding: String, Sendable { case enabled, disabled }

    package var email: String?
    package var isPrivateEmail: Bool?
    package var forwarding: Forwarding?
    /// event_time of the email event whose forwarding state is shown (the newest applied).
    package var emailEventTime: Int64?
    /// event_time of the email event that carried the address shown (the newest that carried one).
    package var addressEventTime: Int64?
    /// Newest consent-revoked event time.
    package var consentRevokedAt: Int64?
    /// Earliest account-delete event time; once set, never cleared.
    package var deletedAt: Int64?
    /// Newest consent-revoked or account-delete event time.
    package var consentEventTime: Int64?
    /// When a privacy request erased the user's address (wall-clock ms): email events up to then
    /// never store it again (and are redacted themselves); a newer one may.
    package var erasedAt: Int64?

    package init(
        email: String? = nil, isPrivateEmail: Bool? = nil, forwarding: Forwarding? = nil, emailEventTime: Int64? = nil,
        addressEventTime: Int64? = nil, consentRevokedAt: Int64? = nil, deletedAt: Int64? = nil, consentEventTime: Int64? = nil,
        erasedAt: Int64? = nil
    ) {
        self.erasedAt = erasedAt
        self.addressEventTime = addressEventTime
        self.email = email
        self.isPrivateEmail = isPrivateEmail
        self.forwarding = forwarding
        self.emailEventTime = emailEventTime
        self.consentRevokedAt = consentRevokedAt
        self.deletedAt = deletedAt
        self.consentEventTime = consentEventTime
    }

    package static let unknown = AccountState()
}

/// Which of the user's sessions an effect revokes.
package enum SessionRevocation: Sendable, Equatable {
    case none
    /// Active sessions created at or before this event time (ms): consent-revoked.
    case createdAtOrBefore(Int64, reason: String)
    /// Every active session: account-delete.
    case all(reason: String)
}

/// The decision for one event against the user's current state: pure, no clock, no I/O.
package struct EffectPlan: Sendable, Equatable {
    package var account: AccountState
    package var revoke: SessionRevocation
    /// Erase the user's email address everywhere we hold it (account deleted, erasure on).
    package var erase: Bool
    /// A short name of what changed, for logs, NOTIFY and callbacks (`none` when nothing did).
    package var effect: String
}

/// The effect rules. Each states what Apple's event means and how order is decided, so that the
/// final state equals applying the user's events in `event_time` order whatever order they are
/// delivered in, and applying one twice changes nothing. Every field is a join of its events —
/// commutative, associative, idempotent:
///
/// - forwarding is a last-writer-wins register on `emailEventTime`: only a newer email event changes
///   it (an `email-enabled` older than the stored `email-disabled` does not re-enable); the address
///   is a second register on `addressEventTime`, written by the newest event that carried one (an
///   email event without an address leaves it, whichever order the two arrive in);
/// - `consentRevokedAt` and `consentEventTime` only grow; `deletedAt` keeps the earliest deletion and
///   nothing clears it;
/// - with erasure on (the default), a deleted account holds no email state at all — deletion clears
///   it and a late email event leaves it clear (and is itself erased) — so "deleted, then an older
///   email event" and "email event, then deletion" end the same;
/// - sessions: consent-revoked revokes the active sessions created at or before its own event time
///   (a sign-in after the revocation is new consent and stays); account-delete revokes all. A
///   session is attributed to the earliest revoking event, so the attribution does not depend on
///   delivery order either (the store re-attributes when an older event arrives later).
package enum EffectRules {
    package static func plan(_ event: AppleEvent, on state: AccountState, eraseOnDelete: Bool) -> EffectPlan {
        guard let type = event.type else {
            return EffectPlan(account: state, revoke: .none, erase: false, effect: "none")
        }
        let time = event.eventTimeMillis
        var account = state
        switch type {
        case .emailDisabled, .emailEnabled:
            // Apple: the user turned forwarding to their (relay) address off / on. Stop, or resume,
            // emailing it.
            if account.deletedAt != nil && eraseOnDelete {
                return EffectPlan(account: account, revoke: .none, erase: true, effect: "none")
            }
            var changed = false
            // An event from before a privacy erasure brings the erased address back: drop it (and
            // redact the notification that carries it); its forwarding state still counts.
            let predatesErasure = account.erasedAt.map { time <= $0 } ?? false
            if let email = event.email, !predatesErasure, account.addressEventTime.map({ time > $0 }) ?? true {
                account.email = email
                account.isPrivateEmail = event.isPrivateEmail
                account.addressEventTime = time
                changed = true
            }
            let redact = predatesErasure && event.email != nil
            guard account.emailEventTime.map({ time > $0 }) ?? true else {
                return EffectPlan(account: account, revoke: .none, erase: redact, effect: changed ? "email_address_updated" : "none")
            }
            account.forwarding = type == .emailDisabled ? .disabled : .enabled
            account.emailEventTime = time
            return EffectPlan(
                account: account, revoke: .none, erase: redact,
                effect: type == .emailDisabled ? "email_forwarding_disabled" : "email_forwarding_enabled")
        case .consentRevoked:
            // Apple: the user stopped using Sign in with Apple with this app. Sign them out of every
            // session that existed when they did.
            account.consentRevokedAt = max(account.consentRevokedAt ?? time, time)
            account.consentEventTime = max(account.consentEventTime ?? time, time)
            return EffectPlan(
                account: account, revoke: .createdAtOrBefore(time, reason: EventType.consentRevoked.rawValue), erase: false,
                effect: "consent_revoked")
        case .accountDelete:
            // Apple: the user deleted their Apple ID. Invalidate everything tied to it: every
            // session and, by default, the address wherever we hold it. Nothing undoes this.
            account.deletedAt = min(account.deletedAt ?? time, time)
            account.consentEventTime = max(account.consentEventTime ?? time, time)
            if eraseOnDelete {
                account.email = nil
                account.isPrivateEmail = nil
                account.forwarding = nil
                account.emailEventTime = nil
                account.addressEventTime = nil
            }
            return EffectPlan(
                account: account, revoke: .all(reason: EventType.accountDelete.rawValue), erase: eraseOnDelete, effect: "account_deleted")
        }
    }
}
