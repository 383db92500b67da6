import Synchronization

/// Whether this process's `siwa_jobs` listener holds its LISTEN, and so how long an idle loop
/// waits for work: its poll interval while nobody listens (no NOTIFY can wake it), `quietWait`
/// while the listener's NOTIFYs and its check wake it (River's and Oban's way: wake on events,
/// poll rarely). An idle process then costs the database a check every few seconds, not a claim
/// per loop every 100 ms.
package final class ListenState: Sendable {
    /// The longest an idle loop sleeps while the listener is connected: a net under the net.
    package static let quietWait: Duration = .seconds(300)

    private let listening = Atomic<Bool>(false)

    package init() {}

    package var isListening: Bool { listening.load(ordering: .acquiring) }

    func set(_ value: Bool) { listening.store(value, ordering: .releasing) }

    /// How long a loop polling every `poll` waits, idle, before it looks again.
    package func idleWait(poll: Duration) -> Duration { isListening ? max(poll, Self.quietWait) : poll }
}
