/// A lane of the job queue: which kind of work a job is. Stored as `jobs.lane` (text).
package enum Lane: String, Sendable, CaseIterable {
    /// Apply a notification's effect to accounts and sessions (in a batch transaction, per-user gate).
    case effects
    /// Deliver an applied effect to the backend's callback URL.
    case callbacks
    /// Deliver an alert message to a sink.
    case alerts
}

/// The lanes whose jobs are HTTP deliveries: leased, claimed oldest first, no per-user gate.
package enum DeliveryLane: String, Sendable {
    case callbacks, alerts

    package var lane: Lane { self == .callbacks ? .callbacks : .alerts }
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
