import SiwaDomain

/// A lane of the job queue: which kind of work a job is (`jobs.lane`), declared once here. The
/// listener's doorbells, the depth and lag reads of monitoring, and the metrics' labels are built
/// from `all`. A new lane is: a declaration here, a migration (its name in the lane CHECKs of
/// `jobs` and `job_attempts`, and a partial index of its ready jobs) and, for a delivery lane, a
/// sender with its `DeliveryLane` (SiwaWorkers).
package struct Lane: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// How the ready (available or retryable) jobs of a lane are indexed; `depth` and `signals`
    /// read each lane through its own partial indexes, never the whole table.
    package enum ReadyIndex: Sendable {
        /// One index over both ready states, by `(run_at, id)`.
        case oneForBoth
        /// One index per state (effects: available jobs in event order, retries by `run_at`).
        case onePerState
    }

    package let rawValue: String
    package let readyIndex: ReadyIndex
    /// The payload is a secret (an encrypted token): cleared when the job completes.
    package let payloadIsSecret: Bool

    private init(_ name: String, readyIndex: ReadyIndex = .oneForBoth, payloadIsSecret: Bool = false) {
        self.rawValue = name
        self.readyIndex = readyIndex
        self.payloadIsSecret = payloadIsSecret
    }

    /// A declared lane by its name; nil for any other.
    package init?(rawValue: String) {
        guard let lane = Self.all.first(where: { $0.rawValue == rawValue }) else { return nil }
        self = lane
    }

    package var description: String { rawValue }

    /// Apply a notification's effect to accounts and sessions (in a batch transaction, per-user gate).
    package static let effects = Lane("effects", readyIndex: .onePerState)
    /// Deliver an applied effect to the backend's callback URL.
    package static let callbacks = Lane("callbacks")
    /// Deliver an alert message to a sink.
    package static let alerts = Lane("alerts")

    /// Revoke a user's Apple token at `/auth/revoke` (its ciphertext is the payload).
    package static let appleRevocations = Lane("apple_revocations", payloadIsSecret: true)

    package static let all: [Lane] = [.effects, .callbacks, .alerts, .appleRevocations]
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

    /// The status a notification shows while its effect job is in this state.
    package var notificationStatus: ProcessingStatus {
        switch self {
        case .available, .running: .pending
        case .retryable: .retrying
        case .completed: .applied
        case .discarded: .discarded
        }
    }
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
