import Foundation

/// One app's user: the key of an account.
package struct AccountKey: Hashable, Sendable {
    package var aud: String
    package var sub: String

    package init(aud: String, sub: String) {
        self.aud = aud
        self.sub = sub
    }
}

/// A claimed effect job as the planner reads it: the job and the event it applies.
package struct EffectJob: Sendable, Equatable {
    package var id: Int
    package var jti: String
    package var aud: String
    package var event: AppleEvent

    package init(id: Int, jti: String, aud: String, event: AppleEvent) {
        self.id = id
        self.jti = jti
        self.aud = aud
        self.event = event
    }

    package var user: AccountKey { AccountKey(aud: aud, sub: event.sub) }
}

/// The sessions one revoking event revokes: its user's active sessions created at or before
/// `cutoff` (nil: all of them), attributed to the event.
package struct SessionRevocationOrder: Sendable, Equatable {
    package var jobID: Int
    package var jti: String
    package var user: AccountKey
    package var cutoff: Int64?
    package var reason: String
    package var eventTimeMillis: Int64

    package init(jobID: Int, jti: String, user: AccountKey, cutoff: Int64?, reason: String, eventTimeMillis: Int64) {
        self.jobID = jobID
        self.jti = jti
        self.user = user
        self.cutoff = cutoff
        self.reason = reason
        self.eventTimeMillis = eventTimeMillis
    }
}

/// What the effects of one claimed batch do, decided by `EffectRules` with no I/O: the store
/// executes it (accounts written, sessions revoked, addresses erased, jobs completed).
package struct EffectBatchPlan: Sendable, Equatable {
    /// A user's account as the rules left it.
    package struct AccountChange: Sendable, Equatable {
        package var user: AccountKey
        package var account: AccountState
    }

    /// The jobs in the order the rules applied them: (event time, job id), so each user's events
    /// in event order.
    package var jobs: [EffectJob]
    /// Each job's effect name (`EffectPlan.effect`), by job id.
    package var effects: [Int: String]
    /// Every user of the batch once, in the order their first job was applied.
    package var accounts: [AccountChange]
    /// In job order.
    package var revocations: [SessionRevocationOrder]
    /// Users whose address must leave every place it is held, in job order.
    package var erase: [AccountKey]

    /// The users of `jobs`, each once, in their first job's order: the accounts to lock.
    package static func users(of jobs: [EffectJob]) -> [AccountKey] {
        var seen = Set<AccountKey>()
        return ordered(jobs).map(\.user).filter { seen.insert($0).inserted }
    }

    /// Plans `jobs` against the users' current `accounts` (a user missing there has none yet).
    package static func plan(_ jobs: [EffectJob], accounts: [AccountKey: AccountState], eraseOnDelete: Bool) -> EffectBatchPlan {
        let held = ordered(jobs)
        var states = accounts
        var result = EffectBatchPlan(jobs: held, effects: [:], accounts: [], revocations: [], erase: [])
        var erased = Set<AccountKey>()
        for job in held {
            let user = job.user
            let plan = EffectRules.plan(job.event, on: states[user] ?? .unknown, eraseOnDelete: eraseOnDelete)
            states[user] = plan.account
            result.effects[job.id] = plan.effect
            if plan.erase, erased.insert(user).inserted { result.erase.append(user) }
            let cutoff: Int64?
            let reason: String
            switch plan.revoke {
            case .none: continue
            case .createdAtOrBefore(let time, let why): (cutoff, reason) = (time, why)
            case .all(let why): (cutoff, reason) = (nil, why)
            }
            result.revocations.append(
                SessionRevocationOrder(jobID: job.id, jti: job.jti, user: user, cutoff: cutoff, reason: reason, eventTimeMillis: job.event.eventTimeMillis))
        }
        result.accounts = users(of: held).map { AccountChange(user: $0, account: states[$0] ?? .unknown) }
        return result
    }

    /// What each job did, in job order, once the store has counted the active sessions each
    /// revoking event (by jti) revoked.
    package func applied(revokedSessions: [String: Int]) -> [AppliedEffect] {
        jobs.map { job in
            AppliedEffect(
                jobID: job.id, jti: job.jti, aud: job.aud, sub: job.event.sub, type: job.event.type?.rawValue ?? job.event.rawType,
                eventTimeMillis: job.event.eventTimeMillis, effect: effects[job.id] ?? "none", revokedSessions: revokedSessions[job.jti] ?? 0)
        }
    }

    private static func ordered(_ jobs: [EffectJob]) -> [EffectJob] {
        jobs.sorted { ($0.event.eventTimeMillis, $0.id) < ($1.event.eventTimeMillis, $1.id) }
    }
}

/// What applying one job did (for logs, NOTIFY and callbacks).
package struct AppliedEffect: Sendable, Equatable {
    package var jobID: Int
    package var jti: String
    package var aud: String
    package var sub: String
    package var type: String
    package var eventTimeMillis: Int64
    package var effect: String
    package var revokedSessions: Int

    package init(jobID: Int, jti: String, aud: String, sub: String, type: String, eventTimeMillis: Int64, effect: String, revokedSessions: Int) {
        self.jobID = jobID
        self.jti = jti
        self.aud = aud
        self.sub = sub
        self.type = type
        self.eventTimeMillis = eventTimeMillis
        self.effect = effect
        self.revokedSessions = revokedSessions
    }

    /// The `siwa_effects` NOTIFY payload: small, no email address.
    package var noticeJSON: String {
        JSONValue.object([
            "type": .string(type), "aud": .string(aud), "sub": .string(sub), "jti": .string(jti), "effect": .string(effect),
            "revoked_sessions": .number(Double(revokedSessions)),
        ]).jsonText
    }

    /// The callback that tells the backend about this effect.
    package var callback: EffectCallback {
        EffectCallback(
            type: type, aud: aud, sub: sub, jti: jti, eventTime: iso8601(millis: eventTimeMillis), effect: effect, revokedSessions: revokedSessions)
    }
}

/// The body of an effect callback (no email address): what the backend receives.
package struct EffectCallback: Sendable, Equatable, Codable {
    package var type: String
    package var aud: String
    package var sub: String
    package var jti: String
    /// ISO 8601, milliseconds.
    package var eventTime: String
    package var effect: String
    package var revokedSessions: Int

    package init(type: String, aud: String, sub: String, jti: String, eventTime: String, effect: String, revokedSessions: Int) {
        self.type = type
        self.aud = aud
        self.sub = sub
        self.jti = jti
        self.eventTime = eventTime
        self.effect = effect
        self.revokedSessions = revokedSessions
    }

    enum CodingKeys: String, CodingKey {
        case type, aud, sub, jti, effect
        case eventTime = "event_time"
        case revokedSessions = "revoked_sessions"
    }

    /// Compact JSON, keys sorted.
    package var jsonText: String {
        JSONValue.object([
            "type": .string(type), "aud": .string(aud), "sub": .string(sub), "jti": .string(jti), "event_time": .string(eventTime),
            "effect": .string(effect), "revoked_sessions": .number(Double(revokedSessions)),
        ]).jsonText
    }
}
