import Logging
import PostgresNIO
import ServiceLifecycle
import SiwaRuntime
import Synchronization

/// Tells idle workers that jobs were enqueued: workers in this process at once, workers in other
/// processes with `NOTIFY siwa_jobs` sent after the commit, never inside it.
///
/// Why not inside the ingest transaction: PostgreSQL serializes the commits of transactions that
/// NOTIFY, so a NOTIFY in every commit batch made concurrent batches flush one after another.
/// Here NOTIFYs are coalesced by a loop of its own (a `Service`): at most one in flight, at most
/// one per `minimumInterval`, and however many batches commit meanwhile, one more follows.
/// Workers never rely on it — they also poll — so a lost NOTIFY costs latency, never a job.
package final class JobsNotifier: Service, Sendable {
    private struct State {
        var pending = false
        var localWakers: [@Sendable () -> Void] = []
    }

    private let client: PostgresClient
    private let logger: Logger
    private let minimumInterval: Duration
    private let state = Mutex(State())
    private let doorbell = Doorbell()
    /// Under load a NOTIFY goes out every `minimumInterval`: on a connection kept meanwhile (nil:
    /// one leased per NOTIFY).
    private let kept: KeptConnection?

    package init(client: PostgresClient, minimumInterval: Duration = .milliseconds(5), keepConnection: Bool = false, logger: Logger) {
        self.client = client
        self.kept = keepConnection ? KeptConnection(client: client) : nil
        self.minimumInterval = minimumInterval
        self.logger = logger
    }

    /// Workers of this process to wake directly.
    package func addLocalWaker(_ waker: @escaping @Sendable () -> Void) {
        state.withLock { $0.localWakers.append(waker) }
    }

    /// Jobs were committed.
    package func jobsEnqueued() {
        let wakers = state.withLock { state in
            state.pending = true
            return state.localWakers
        }
        for wake in wakers { wake() }
        doorbell.ring()
    }

    package func run() async throws {
        await Scheduler.run(
            Schedule(interval: .seconds(3600), doorbell: doorbell), once: { await self.runOnce() },
            pace: { $0 ? .after(self.minimumInterval) : .idle }
        ) { _ in }
        kept?.close()
    }

    /// Sends one NOTIFY if jobs were enqueued since the last; returns whether it did.
    @discardableResult
    package func runOnce() async -> Bool {
        let pending = state.withLock { state in
            defer { state.pending = false }
            return state.pending
        }
        guard pending else { return false }
        do {
            let (logger, notify): (Logger, PostgresQuery) = (self.logger, "SELECT pg_notify('siwa_jobs', '')")
            if let kept {
                try await kept.withConnection { _ = try await $0.query(notify, logger: logger) }
            } else {
                try await client.bounded.query(notify, logger: logger)
            }
        } catch {
            logger.debug("NOTIFY siwa_jobs failed; workers elsewhere find the jobs when they poll", metadata: ["error": "\(loggable(error))"])
        }
        return true
    }
}
