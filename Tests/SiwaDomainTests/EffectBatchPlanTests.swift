import Foundation
import SiwaDomain
import Testing

@Suite("Effect batch plan", .timeLimit(.minutes(10)))
struct EffectBatchPlanTests {
    static let app = "com.example.app"

    func job(_ id: Int, _ type: String, _ time: Int64, sub: String = "user", email: String? = nil) -> EffectJob {
        EffectJob(
            id: id, jti: "jti-\(id)", aud: Self.app,
            event: AppleEvent(rawType: type, type: EventType(apple: type), sub: sub, eventTimeMillis: time, email: email, isPrivateEmail: email.map { _ in true }))
    }

    func account(_ plan: EffectBatchPlan, _ sub: String = "user") -> AccountState? {
        plan.accounts.first { $0.user == AccountKey(aud: Self.app, sub: sub) }?.account
    }

    @Test("email-disabled stores the address and disables forwarding; nothing is revoked or erased")
    func emailDisabled() {
        let plan = EffectBatchPlan.plan([job(1, "email-disabled", 10, email: "a@privaterelay.appleid.com")], accounts: [:], eraseOnDelete: true)
        #expect(plan.effects == [1: "email_forwarding_disabled"])
        #expect(account(plan)?.forwarding == .disabled)
        #expect(account(plan)?.email == "a@privaterelay.appleid.com")
        #expect(plan.revocations.isEmpty)
        #expect(plan.erase.isEmpty)
    }

    @Test("email-enabled after email-disabled in one batch enables forwarding again, whichever order the jobs were claimed in")
    func emailDisabledThenEnabled() {
        let jobs = [job(2, "email-enabled", 20), job(1, "email-disabled", 10, email: "a@x")]
        for batch in [jobs, jobs.reversed()] {
            let plan = EffectBatchPlan.plan(batch, accounts: [:], eraseOnDelete: true)
            #expect(plan.jobs.map(\.id) == [1, 2])
            #expect(plan.effects == [1: "email_forwarding_disabled", 2: "email_forwarding_enabled"])
            #expect(account(plan)?.forwarding == .enabled)
            #expect(account(plan)?.email == "a@x")
        }
    }

    @Test("an email-enabled older than the stored email-disabled changes nothing")
    func staleEmailEnabled() {
        let stored = AccountState(forwarding: .disabled, emailEventTime: 50)
        let plan = EffectBatchPlan.plan(
            [job(1, "email-enabled", 40)], accounts: [AccountKey(aud: Self.app, sub: "user"): stored], eraseOnDelete: true)
        #expect(plan.effects == [1: "none"])
        #expect(account(plan) == stored)
    }

    @Test("consent-revoked revokes the sessions created at or before its event time, attributed to its jti")
    func consentRevoked() {
        let plan = EffectBatchPlan.plan([job(7, "consent-revoked", 1_000)], accounts: [:], eraseOnDelete: true)
        #expect(plan.effects == [7: "consent_revoked"])
        #expect(
            plan.revocations == [
                SessionRevocationOrder(
                    jobID: 7, jti: "jti-7", user: AccountKey(aud: Self.app, sub: "user"), cutoff: 1_000, reason: "consent-revoked", eventTimeMillis: 1_000)
            ])
        #expect(account(plan)?.consentRevokedAt == 1_000)
        #expect(plan.erase.isEmpty)
    }

    @Test("account-delete revokes every session and erases the address (erasure on), or keeps it (erasure off)")
    func accountDelete() {
        let stored = AccountState(email: "a@x", isPrivateEmail: true, forwarding: .enabled, emailEventTime: 5, addressEventTime: 5)
        let key = AccountKey(aud: Self.app, sub: "user")
        let erasing = EffectBatchPlan.plan([job(3, "account-delete", 100)], accounts: [key: stored], eraseOnDelete: true)
        #expect(erasing.effects == [3: "account_deleted"])
        #expect(erasing.revocations.map(\.cutoff) == [nil])
        #expect(erasing.revocations.map(\.reason) == ["account-delete"])
        #expect(erasing.erase == [key])
        #expect(account(erasing)?.email == nil)
        #expect(account(erasing)?.deletedAt == 100)
        let keeping = EffectBatchPlan.plan([job(3, "account-delete", 100)], accounts: [key: stored], eraseOnDelete: false)
        #expect(keeping.erase.isEmpty)
        #expect(account(keeping)?.email == "a@x")
    }

    @Test("consent-revoked then account-delete of one user: two revocations in event order, the account deleted and erased")
    func consentRevokedThenAccountDelete() {
        let plan = EffectBatchPlan.plan(
            [job(9, "account-delete", 200), job(4, "consent-revoked", 100), job(5, "email-disabled", 150, email: "a@x")], accounts: [:],
            eraseOnDelete: true)
        #expect(plan.jobs.map(\.id) == [4, 5, 9])
        #expect(plan.revocations.map(\.jobID) == [4, 9])
        #expect(plan.revocations.map(\.cutoff) == [100, nil])
        #expect(plan.effects == [4: "consent_revoked", 5: "email_forwarding_disabled", 9: "account_deleted"])
        let state = account(plan)
        #expect(state?.consentRevokedAt == 100)
        #expect(state?.deletedAt == 200)
        #expect(state?.consentEventTime == 200)
        #expect(state?.email == nil)
        #expect(plan.erase == [AccountKey(aud: Self.app, sub: "user")])
    }

    @Test("an email event after the account was deleted (erasure on) stores nothing and is erased itself")
    func emailAfterDelete() {
        let plan = EffectBatchPlan.plan([job(1, "account-delete", 10), job(2, "email-enabled", 20, email: "late@x")], accounts: [:], eraseOnDelete: true)
        #expect(plan.effects == [1: "account_deleted", 2: "none"])
        #expect(account(plan)?.email == nil)
        #expect(plan.erase.count == 1)
    }

    @Test("an unknown event type is applied as no effect")
    func unknownType() {
        let plan = EffectBatchPlan.plan([job(1, "something-new", 10)], accounts: [:], eraseOnDelete: true)
        #expect(plan.effects == [1: "none"])
        #expect(plan.revocations.isEmpty)
        #expect(plan.applied(revokedSessions: [:]).map(\.type) == ["something-new"])
    }

    @Test("users are planned independently and listed once each, in their first job's order")
    func severalUsers() {
        let plan = EffectBatchPlan.plan(
            [job(1, "email-disabled", 30, sub: "b", email: "b@x"), job(2, "consent-revoked", 10, sub: "a"), job(3, "email-enabled", 40, sub: "b")],
            accounts: [:], eraseOnDelete: true)
        #expect(plan.accounts.map(\.user.sub) == ["a", "b"])
        #expect(EffectBatchPlan.users(of: plan.jobs).map(\.sub) == ["a", "b"])
        #expect(account(plan, "a")?.consentRevokedAt == 10)
        #expect(account(plan, "b")?.forwarding == .enabled)
        #expect(plan.revocations.map(\.user.sub) == ["a"])
    }

    @Test("the applied effects carry the sessions each revoking event revoked, and their callbacks and notices say so (no address)")
    func appliedAndCallback() throws {
        let plan = EffectBatchPlan.plan(
            [job(4, "consent-revoked", 1_735_689_600_000), job(5, "email-disabled", 1_735_689_600_500, email: "a@x")], accounts: [:],
            eraseOnDelete: true)
        let applied = plan.applied(revokedSessions: ["jti-4": 2])
        #expect(applied.map(\.revokedSessions) == [2, 0])
        #expect(applied.map(\.effect) == ["consent_revoked", "email_forwarding_disabled"])
        let callback = applied[0].callback
        #expect(
            callback
                == EffectCallback(
                    type: "consent-revoked", aud: Self.app, sub: "user", jti: "jti-4", eventTime: "2025-01-01T00:00:00.000Z", effect: "consent_revoked",
                    revokedSessions: 2))
        let decoded = try JSONDecoder().decode(EffectCallback.self, from: Data(callback.jsonText.utf8))
        #expect(decoded == callback)
        #expect(!applied[1].callback.jsonText.contains("a@x"))
        #expect(
            applied[0].noticeJSON
                == #"{"aud":"com.example.app","effect":"consent_revoked","jti":"jti-4","revoked_sessions":2,"sub":"user","type":"consent-revoked"}"#)
        #expect(!applied[1].noticeJSON.contains("a@x"))
    }
}
