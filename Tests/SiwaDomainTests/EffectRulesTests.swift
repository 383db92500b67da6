import Foundation
import SiwaDomain
import Testing

@Suite("Effect rules", .timeLimit(.minutes(10)))
struct EffectRulesTests {
    func event(_ type: String, _ time: Int64, email: String? = nil) -> AppleEvent {
        AppleEvent(rawType: type, type: EventType(apple: type), sub: "s", eventTimeMillis: time, email: email, isPrivateEmail: email.map { _ in true })
    }

    func fold(_ events: [AppleEvent], erase: Bool = true) -> AccountState {
        events.reduce(AccountState.unknown) { EffectRules.plan($1, on: $0, eraseOnDelete: erase).account }
    }

    static func permutations<T>(_ items: [T]) -> [[T]] {
        guard items.count > 1 else { return [items] }
        return items.indices.flatMap { index -> [[T]] in
            var rest = items
            let head = rest.remove(at: index)
            return permutations(rest).map { [head] + $0 }
        }
    }

    @Test("email-disabled disables forwarding and remembers the address; email-enabled enables it again")
    func emailEvents() {
        let disabled = fold([event("email-disabled", 10, email: "a@privaterelay.appleid.com")])
        #expect(disabled.forwarding == .disabled)
        #expect(disabled.email == "a@privaterelay.appleid.com")
        #expect(disabled.isPrivateEmail == true)
        let enabled = fold([event("email-disabled", 10, email: "a@x"), event("email-enabled", 20)])
        #expect(enabled.forwarding == .enabled)
        #expect(enabled.email == "a@x")
    }

    @Test("An email-enabled older than the stored email-disabled does not re-enable")
    func olderEnableIgnored() {
        let state = fold([event("email-disabled", 20, email: "a@x"), event("email-enabled", 10)])
        #expect(state.forwarding == .disabled)
        #expect(EffectRules.plan(event("email-enabled", 10), on: state, eraseOnDelete: true).effect == "none")
    }

    @Test("consent-revoked revokes sessions created at or before its event time")
    func consent() {
        let plan = EffectRules.plan(event("consent-revoked", 1000), on: .unknown, eraseOnDelete: true)
        #expect(plan.revoke == .createdAtOrBefore(1000, reason: "consent-revoked"))
        #expect(plan.account.consentRevokedAt == 1000)
    }

    @Test("account-delete revokes all sessions, erases the address, and nothing undoes it; a late email event stores nothing")
    func deletion() {
        let deleted = fold([event("email-disabled", 10, email: "a@x"), event("account-delete", 20)])
        #expect(deleted.deletedAt == 20)
        #expect(deleted.email == nil && deleted.forwarding == nil)
        let late = EffectRules.plan(event("email-enabled", 30, email: "b@x"), on: deleted, eraseOnDelete: true)
        #expect(late.account == deleted)
        #expect(late.erase)
        #expect(fold([event("account-delete", 20), event("consent-revoked", 30), event("email-enabled", 40, email: "c@x")]).deletedAt == 20)
        #expect(EffectRules.plan(event("account-delete", 5), on: .unknown, eraseOnDelete: true).revoke == .all(reason: "account-delete"))
    }

    @Test("With erasure off, deletion keeps the address and email events still apply")
    func erasureOff() {
        let state = fold([event("email-disabled", 10, email: "a@x"), event("account-delete", 20), event("email-enabled", 30)], erase: false)
        #expect(state.deletedAt == 20)
        #expect(state.email == "a@x")
        #expect(state.forwarding == .enabled)
    }

    @Test("Every delivery order of a user's events ends in the state of event_time order", arguments: [true, false])
    func orderIndependence(erase: Bool) {
        let events = [
            event("email-disabled", 10, email: "a@x"), event("email-enabled", 20), event("email-disabled", 25, email: "b@x"),
            event("consent-revoked", 30), event("account-delete", 40), event("email-disabled", 50, email: "c@x"),
        ]
        let expected = fold(events, erase: erase)
        for order in Self.permutations(events) {
            #expect(fold(order, erase: erase) == expected)
        }
        // Every pair out of order, and every subset of three, too.
        for pair in Self.permutations(Array(events.prefix(2))) + Self.permutations(Array(events.suffix(2))) {
            #expect(fold(pair, erase: erase) == fold(pair.sorted { $0.eventTimeMillis < $1.eventTimeMillis }, erase: erase))
        }
    }

    @Test("Applying any event twice changes nothing")
    func idempotence() {
        let events = [event("email-disabled", 10, email: "a@x"), event("email-enabled", 20), event("consent-revoked", 30), event("account-delete", 40)]
        for prefix in 0...events.count {
            let state = fold(Array(events.prefix(prefix)))
            for e in events {
                let once = EffectRules.plan(e, on: state, eraseOnDelete: true).account
                #expect(EffectRules.plan(e, on: once, eraseOnDelete: true).account == once)
            }
        }
    }

    @Test("An event of unknown type has no effect")
    func unknownType() {
        let plan = EffectRules.plan(AppleEvent(rawType: "x", type: nil, sub: "s", eventTimeMillis: 1), on: .unknown, eraseOnDelete: true)
        #expect(plan.effect == "none" && plan.revoke == .none && plan.account == .unknown)
    }
}
