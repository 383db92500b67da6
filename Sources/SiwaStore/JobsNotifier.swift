import Logging
import PostgresNIO
import Synchronization

/// Tells idle workers that jobs were enqueued: workers in this process at once, workers in other
/// processes with `NOTIFY siwa_jobs` sent after the commit, never inside it.
///
/// Why not inside the ingest transaction: PostgreSQL serializes the commits of transactions that
/// NOTIFY (a database-wide lock is held until the commit record is flushed), so a NOTIFY in every
/// commit batch made concurrent batches flush one after another. Here NOTIFYs are coalesced: at
/// most one is in flight, at most one per `minimumInterval` (each NOTIFY is a transaction with
/// its own commit record), and however many batches commit meanwhile, one more follows.
/// Workers never rely on it — they also poll — so a lost NOTIFY costs latency, never a job.
package final class JobsNotifier: Sendable {
    private struct State {
        var sending = false
        var again = false
        var localWakers: [@Sendable () -> Void] = []
    }

    private let client: PostgresClient
    private let logger: Logger
    private let minimumInterval: Duration
    private let state = Mutex(State())

    package init(client: PostgresClient, minimumInterval: Duration = .milliseconds(5), logger: Logger) {
        self.client = client
        self.minimumInterval = minimumInterval
        self.logger = logger
    }

    /// Workers of this process to wake directly.
    package func addLocalWaker(_ waker: @escaping @Sendable () -> Void) {
        state.withLock { $0.localWakers.append(waker) }
    }

    /// Jobs were committed.
    package func jobsEnqueued() {
        let (wakers, start) = state.withLock { state -> ([@Sendable () -> Void], Bool) in
            if state.sending {
                state.again = true
                return (state.localWakers, false)
            }
            state.sending = true
            return (state.localWakers, true)
        }
        for wake in wakers { wake() }
        if start { Task { await self.send() } }
    }

    private func send() async {
        while true {
            let sent = ContinuousClock.now
            do {
                try await client.bounded.query("SELECT pg_notify('siwa_jobs', '')", logger: logger)
            } catch {
                logger.debug("NOTIFY siwa_jobs failed; workers elsewhere find the jobs when they poll", metadata: ["error": "\(loggable(error))"])
            }
            let more = state.withLock { state -> Bool in
                if state.again {
                    state.again = false
                    return true
                }
                state.sending = false
                return false
            }
            if !more { return }
            try? await Task.sleep(until: sent + minimumInterval, clock: .continuous)
        }
    }
}
