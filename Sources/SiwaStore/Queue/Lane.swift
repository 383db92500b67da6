import SiwaDomain

/// A lane of the job queue: which kind of work a job is (`jobs.lane`), declared once as a value.
/// The listener's doorbells, the depth and lag reads of monitoring, the metrics' labels, the
/// generic list and retry (`jobs list|retry --lane`) and the pruner's care for secrets are built
/// from `all`. The schema takes any lane whose jobs have one of the known subjects (sql/024), so a
/// new lane is this declaration (in `all`, to be run by `serve`) and, for a delivery lane, a sender
/// with its `DeliveryLane` (SiwaWorkers); a partial index of its ready jobs keeps its reads cheap.
package struct Lane: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// How the ready (available or retryable) jobs of a lane are indexed; `depth` and `queueLag`
    /// read each lane through its own partial indexes, never the whole table.
    package enum ReadyIndex: Sendable {
        /// One index over both ready states, by `(run_at, id)`.
        case oneForBoth
        /// One index per state (effects: available jobs in event order, retries by `run_at`).
        case onePerState
    }

    /// What a job of the lane is about (which of `jobs`' subject columns it sets).
    package enum Subject: String, Sendable {
        /// A notification (`notification_id`).
        case notification
        /// An alert's message to a sink (`alert_id`, `target`).
        case alert
        /// A user (`aud`, `sub`) and a target (`target`).
        case user
    }

    package let rawValue: String
    package let subject: Subject
    package let readyIndex: ReadyIndex
    /// The payload is a secret (an encrypted token): cleared when the job completes, and a job
    /// still holding it is never pruned.
    package let payloadIsSecret: Bool
    /// Jobs of one target (`aud`, `target`) run one at a time, in id order: a later job waits
    /// while an earlier one is open (the suppression lanes: an address's operations in order).
    package let inOrderPerTarget: Bool

    /// Declares a lane named `name`: lowercase letters, digits and `_`, at most 40 (sql/024).
    package init(_ name: String, subject: Subject, readyIndex: ReadyIndex = .oneForBoth, payloadIsSecret: Bool = false, inOrderPerTarget: Bool = false) {
        precondition(Self.isValidName(name), "a lane's name is lowercase letters, digits and _ (at most 40): \(name)")
        self.rawValue = name
        self.subject = subject
        self.readyIndex = readyIndex
        self.payloadIsSecret = payloadIsSecret
        self.inOrderPerTarget = inOrderPerTarget
    }

    /// A declared lane by its name; nil for any other.
    package init?(rawValue: String) {
        guard let lane = Self.all.first(where: { $0.rawValue == rawValue }) else { return nil }
        self = lane
    }

    package var description: String { rawValue }

    static func isValidName(_ name: String) -> Bool {
        (1...40).contains(name.utf8.count) && name.utf8.first.map { (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) } == true
            && name.utf8.allSatisfy { (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) || $0 == UInt8(ascii: "_") }
    }

    /// Apply a notification's effect to accounts and sessions (in a batch transaction, per-user gate).
    package static let effects = Lane("effects", subject: .notification, readyIndex: .onePerState)
    /// Deliver an applied effect to the backend's callback URL.
    package static let callbacks = Lane("callbacks", subject: .notification)
    /// Deliver an alert message to a sink.
    package static let alerts = Lane("alerts", subject: .alert)
    /// Revoke a user's Apple token at `/auth/revoke` (its ciphertext is the payload).
    package static let appleRevocations = Lane("apple_revocations", subject: .user, payloadIsSecret: true)
    /// Validate a user's kept Apple refresh token at `/auth/token` (the payload is the token's
    /// fingerprint, never the token); one open job per token.
    package static let appleValidations = Lane("apple_validations", subject: .user)

    /// Suppress or lift an address at a mail provider (`aud`, `sub`: the user; `target`: the
    /// address; `kind`: the action; payload: the reason), one lane per provider, in order per address.
    package static func suppressions(_ target: SuppressionTarget) -> Lane {
        Lane("suppressions_\(target.rawValue)", subject: .user, inOrderPerTarget: true)
    }

    /// The lanes this build runs: the listener's doorbells, depth, lag and metrics cover these.
    /// A lane declared elsewhere (a test's) works with every statement that takes a `Lane`.
    package static let all: [Lane] = [.effects, .callbacks, .alerts, .appleRevocations, .appleValidations] + SuppressionTarget.allCases.map(suppressions)
}

/// Where a job stands (`jobs.state`, the `job_state` type).
package enum JobState: String, Sendable, CaseIterable {
    /// Ready to be claimed.
    case available
    /// Failed; ready again at its `run_at`.
    case retryable
    /// Held under a lease by a deliverer.
    case running
    case completed
    /// Out of attempts (or rescued past them); only an operator puts it back.
    case discarded

    /// Not finished: it still holds its place in its lane.
    package var isOpen: Bool { self == .available || self == .retryable || self == .running }
}

/// What one attempt at a job came to (`job_attempts.outcome`).
package enum AttemptOutcome: String, Sendable, CaseIterable {
    /// An effect applied.
    case applied
    /// A delivery answered 2xx.
    case delivered
    /// Failed; the job will be tried again.
    case retrying
    /// Failed for the last time.
    case discarded
    /// Its deliverer stopped renewing the lease.
    case leaseExpired = "lease_expired"
}
