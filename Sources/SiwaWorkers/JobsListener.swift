import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaRuntime
import SiwaStore
import Synchronization

/// LISTEN siwa_jobs on one pooled connection: each NOTIFY rings the doorbell of its lane's loops
/// (the payload names the lane; any other payload, as ingest's empty one, means effects). While
/// it listens, one check per process (`JobQueue.nextDue`, every `checkInterval` and when a retry
/// falls due) rings the lanes with work a lost NOTIFY left, and the loops sleep long
/// (`ListenState`); when it loses the connection it wakes them all, and they poll until it is
/// back.
package final class JobsListener: Service, Sendable {
    package let queue: JobQueue
    /// The lanes this process runs, each with its loops' doorbell.
    package let doorbells: [Lane: Doorbell]
    /// Rung on each ingest NOTIFY besides the effects lane (the stats folder).
    package let activity: [Doorbell]
    package let state: ListenState
    package let checkInterval: Duration
    let logger: Logger
    /// How long one LISTEN holds its connection before giving it back and taking one again.
    let session: Duration

    init(
        queue: JobQueue, doorbells: [Lane: Doorbell], activity: [Doorbell] = [], state: ListenState, checkInterval: Duration,
        session: Duration = .seconds(300), logger: Logger
    ) {
        self.queue = queue
        self.doorbells = doorbells
        self.activity = activity
        self.state = state
        self.checkInterval = checkInterval
        self.session = session
        self.logger = logger
    }

    package func run() async throws {
        var schedule = Schedule(interval: .seconds(1))
        schedule.abandonOnShutdown = true
        await Scheduler.run(schedule, once: { try await self.runOnce() }, pace: { _ in .again }) { error in
            logger.debug("LISTEN siwa_jobs interrupted; reconnecting", metadata: ["error": "\(loggable(error))"])
            // Nobody listens now: every loop looks again and polls until LISTEN is back.
            for doorbell in doorbells.values { doorbell.wakeAll() }
        }
    }

    /// One LISTEN session of up to `session` (nil: the listener's), with its checks; returns how
    /// many notifications it received.
    ///
    /// The connection goes back to the pool after each session: after a database outage
    /// postgres-nio's pool serves the requests queued meanwhile as connections come back, and a
    /// LISTEN holding one for good could starve every other query.
    @discardableResult
    package func runOnce(session: Duration? = nil) async throws -> Int {
        let received = Counter()
        // Doorbells, not sleeps: a wait on one is cut short by `close`, which every exit does.
        let listening = Doorbell()
        let stop = Doorbell()
        defer { state.set(false) }
        let holding = BoundedPostgres(client: queue.client, limit: (session ?? self.session) + .seconds(30))
        try await holding.withConnection { connection in
            let closed = Doorbell()
            connection.closeFuture.whenComplete { _ in closed.close() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                defer {
                    stop.close()
                    listening.close()
                    closed.close()
                }
                group.addTask {
                    try await connection.listen(on: "siwa_jobs") { notifications in
                        self.state.set(true)
                        listening.close()
                        for try await notification in notifications {
                            received.add()
                            let lane = Lane(rawValue: notification.payload) ?? .effects
                            if lane == .effects { for doorbell in self.activity { doorbell.ring() } }
                            self.doorbells[lane]?.ring()
                        }
                    }
                }
                group.addTask {
                    // Catches up on anything enqueued before LISTEN took effect, then keeps
                    // checking, on this connection (a check opens none).
                    await listening.wait(timeout: session ?? self.session)
                    while !stop.isClosed { await stop.wait(timeout: try await self.check(on: connection)) }
                }
                group.addTask { await stop.wait(timeout: session ?? self.session) }
                group.addTask {
                    // The connection closed (the database gone, or the relay left a silent host):
                    // postgres-nio may lose the check or the LISTEN in flight and answer neither
                    // until the session's limit, so the close itself says nobody listens: every
                    // loop is woken and polls. The session ends as the LISTEN task does (ending it
                    // here would cancel that task into an UNLISTEN on the closed connection).
                    await closed.wait(timeout: (session ?? self.session) + .seconds(60))
                    guard connection.isClosed, !stop.isClosed else { return }
                    self.state.set(false)
                    for doorbell in self.doorbells.values { doorbell.wakeAll() }
                    await stop.wait(timeout: (session ?? self.session) + .seconds(60))
                }
                try await group.next()
                group.cancelAll()
            }
        }
        return received.value
    }

    /// One check: rings each lane with a job ready now; returns how long until the next check
    /// (sooner than `checkInterval` when a retry falls due before).
    @discardableResult
    package func check(on connection: PostgresConnection? = nil) async throws -> Duration {
        let (now, due) = try await queue.nextDue(Array(doorbells.keys), on: connection)
        let plan = Self.plan(due: due, now: now, interval: checkInterval)
        for lane in plan.ring { doorbells[lane]?.ring() }
        return plan.next
    }

    /// Which lanes to ring at `now`, and when to look again: at the earliest future due time
    /// within `interval` (a few milliseconds after it, so the job is due when the loop claims).
    static func plan(due: [Lane: Date], now: Date, interval: Duration) -> (ring: [Lane], next: Duration) {
        var next = interval
        var ring: [Lane] = []
        for (lane, at) in due {
            let wait = at.timeIntervalSince(now)
            if wait <= 0 {
                ring.append(lane)
            } else {
                next = min(next, .milliseconds(Int64((wait * 1000).rounded(.up)) + 5))
            }
        }
        return (ring, next)
    }
}

private final class Counter: Sendable {
    private let count = Mutex(0)
    func add() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
