import Foundation
import SiwaDomain
import Testing

@Suite("Suppression rules", .timeLimit(.minutes(10)))
struct SuppressionRulesTests {
    static let aud = "com.example.app"

    func job(_ id: Int, _ type: String, _ time: Int64, sub: String = "s1", email: String? = nil) -> EffectJob {
        EffectJob(
            id: id, jti: "j\(id)", aud: Self.aud,
            event: AppleEvent(rawType: type, type: EventType(apple: type), sub: sub, eventTimeMillis: time, email: email, isPrivateEmail: email.map { _ in true }))
    }

    func fold(_ jobs: [EffectJob], known: [AccountKey: [String]] = [:], policy: SuppressionRules.Policy = .init())
        -> (states: [SuppressionKey: SuppressionState], changes: [SuppressionChange])
    {
        // One job at a time, as separate batches would apply them.
        var states: [SuppressionKey: SuppressionState] = [:]
        var changes: [SuppressionChange] = []
        for job in jobs {
            let step = SuppressionRules.plan([job], known: known, states: states, policy: policy)
            states = step.states
            changes += step.changes
        }
        return (states, changes)
    }

    static func permutations<T>(_ items: [T]) -> [[T]] {
        guard items.count > 1 else { return [items] }
        return items.indices.flatMap { index -> [[T]] in
            var rest = items
            let head = rest.remove(at: index)
            return permutations(rest).map { [head] + $0 }
        }
    }

    @Test("email-disabled suppresses the address it names; a newer email-enabled lifts it; each is one change")
    func disableThenEnable() {
        let result = fold([job(1, "email-disabled", 10, email: "a@privaterelay.appleid.com"), job(2, "email-enabled", 20, email: "a@privaterelay.appleid.com")])
        #expect(result.changes.map(\.action) == [.suppress, .lift])
        #expect(result.changes.map(\.reason) == [.emailDisabled, .emailEnabled])
        #expect(result.states[SuppressionKey(aud: Self.aud, address: "a@privaterelay.appleid.com")]?.suppressed == false)
    }

    @Test("a late email-disabled, older than the email-enabled already applied, never re-suppresses; any delivery order ends the same")
    func lateDisableIgnored() {
        let events = [
            job(1, "email-disabled", 10, email: "a@private.icloud.com"), job(2, "email-enabled", 20, email: "a@private.icloud.com"),
            job(3, "email-disabled", 30, email: "a@private.icloud.com"), job(4, "email-enabled", 40, email: "a@private.icloud.com"),
        ]
        let key = SuppressionKey(aud: Self.aud, address: "a@private.icloud.com")
        for order in Self.permutations(events) {
            let result = fold(order)
            #expect(result.states[key]?.suppressed == false, "order \(order.map(\.id))")
            #expect(result.states[key]?.eventTime == 40)
        }
        // Delivered newest first: the older ones change nothing, so the feed says nothing.
        #expect(fold(events.reversed()).changes.isEmpty)
        // The enabled event first, then the older disabled: nothing suppressed, nothing fed.
        #expect(fold([events[1], events[0]]).changes.isEmpty)
    }

    @Test("an event that changes nothing adds nothing: disabled twice is one change, enabled for an address never suppressed is none")
    func noChangeNoLine() {
        #expect(fold([job(1, "email-disabled", 10, email: "a@x.example"), job(2, "email-disabled", 20, email: "a@x.example")]).changes.count == 1)
        #expect(fold([job(1, "email-enabled", 10, email: "a@x.example")]).changes.isEmpty)
    }

    @Test("account-delete suppresses every address known for the user (the account's, earlier events'), with no address in its event")
    func deleteSuppressesKnown() {
        let user = AccountKey(aud: Self.aud, sub: "s1")
        let result = fold([job(1, "email-enabled", 5, email: "new@privaterelay.appleid.com"), job(2, "account-delete", 10)], known: [user: ["old@example.com"]])
        #expect(Set(result.changes.map(\.key.address)) == ["old@example.com", "new@privaterelay.appleid.com"])
        #expect(result.changes.allSatisfy { $0.action == .suppress && $0.reason == .accountDeleted })
        // Another user's address is not touched.
        #expect(fold([job(1, "account-delete", 10, sub: "s2")], known: [user: ["old@example.com"]]).changes.isEmpty)
    }

    @Test("consent-revoked suppresses only where the app says so")
    func consentRevokedByPolicy() {
        let user = AccountKey(aud: Self.aud, sub: "s1")
        #expect(fold([job(1, "consent-revoked", 10)], known: [user: ["a@x.example"]]).changes.isEmpty)
        let on = fold([job(1, "consent-revoked", 10)], known: [user: ["a@x.example"]], policy: .init(onConsentRevoked: true))
        #expect(on.changes.map(\.reason) == [.consentRevoked])
    }

    @Test("non-relay addresses count the same; addresses are compared trimmed and lowercased; what is not a mailbox is skipped")
    func addresses() {
        let result = fold([job(1, "email-disabled", 10, email: " Person@Example.COM "), job(2, "email-enabled", 20, email: "person@example.com")])
        #expect(result.changes.map(\.key.address) == ["person@example.com", "person@example.com"])
        #expect(fold([job(1, "email-disabled", 10, email: "not-an-address")]).changes.isEmpty)
        #expect(fold([job(1, "email-disabled", 10, email: "a/b@x.example")]).changes.isEmpty)
    }

    @Test("one batch applies its events in event-time order, whatever their order in the batch")
    func batchOrder() {
        let jobs = [job(1, "email-enabled", 20, email: "a@x.example"), job(2, "email-disabled", 10, email: "a@x.example")]
        let result = SuppressionRules.plan(jobs, known: [:], states: [:], policy: .init())
        #expect(result.changes.map(\.action) == [.suppress, .lift])
        #expect(result.states[SuppressionKey(aud: Self.aud, address: "a@x.example")]?.suppressed == false)
    }
}
