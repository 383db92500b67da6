import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaStore
import Synchronization

/// Records rejected deliveries off the request path: sampled (see `RejectionSampler`), buffered,
/// and written in batches with per-minute counts. A rejection is an answer already given, so its
/// record may trail by up to `flushInterval`; the buffer is bounded so a flood costs bounded memory.
package final class RejectionRecorder: Service, Sendable {
    private struct CountKey: Hashable { var minute: Date; var reason: RejectionReason }
    private struct State {
        var sampler: RejectionSampler
        var pending: [RejectionRecord] = []
        var counts: [CountKey: (recorded: Int, sampledOut: Int)] = [:]
        var writing = 0
    }

    private let store: RejectionStore
    private let flushInterval: Duration
    private let maximumPending: Int
    private let metrics: ReceiverMetrics?
    private let logger: Logger
    private let state: Mutex<State>

    package init(store: RejectionStore, limitPerMinute: Int, flushInterval: Duration = .seconds(1), maximumPending: Int = 10_000, metrics: ReceiverMetrics?, logger: Logger) {
        self.store = store
        self.flushInterval = flushInterval
        self.maximumPending = maximumPending
        self.metrics = metrics
        self.logger = logger
        self.state = Mutex(State(sampler: RejectionSampler(limitPerMinute: limitPerMinute)))
    }

    /// Takes a rejection: buffered for the next batch, or only counted. Never blocks on I/O.
    package func record(_ record: RejectionRecord) {
        let key = CountKey(minute: RejectionSampler.minute(of: record.receivedAt), reason: record.reason)
        let admitted = state.withLock { state in
            var admitted = state.sampler.admit(record.reason, at: record.receivedAt, genuineToken: record.token != nil)
            if admitted && state.pending.count >= maximumPending { admitted = false }
            if admitted { state.pending.append(record) }
            var count = state.counts[key] ?? (0, 0)
            if admitted { count.recorded += 1 } else { count.sampledOut += 1 }
            state.counts[key] = count
            return admitted
        }
        metrics?.count(rejected: record.reason)
        if !admitted { metrics?.count(sampledOut: record.reason) }
    }

    /// Writes what is buffered, and returns once every batch taken so far (also by a concurrent
    /// flush) is written. On failure the batch is put back (within the bound) for next time.
    package func flush() async {
        await writeBatch()
        while state.withLock({ $0.writing > 0 }) {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    private func writeBatch() async {
        let (records, counts) = state.withLock { state in
            defer {
                state.pending.removeAll(keepingCapacity: true)
                state.counts.removeAll(keepingCapacity: true)
                state.writing += 1
            }
            return (state.pending, state.counts)
        }
        defer { state.withLock { $0.writing -= 1 } }
        guard !records.isEmpty || !counts.isEmpty else { return }
        do {
            try await store.insert(
                records,
                counts: counts.map { RejectionCount(minute: $0.key.minute, reason: $0.key.reason, recorded: $0.value.recorded, sampledOut: $0.value.sampledOut) })
        } catch {
            // One unacceptable row must not block every later batch: insert row by row, dropping
            // what the database refuses as data; if the database itself is down, keep all for later.
            logger.warning("could not write rejection records as a batch", metadata: ["count": "\(records.count)", "error": "\(loggable(error))"])
            let remaining = await store.insertIndividually(records)
            state.withLock { state in
                state.pending.insert(contentsOf: remaining.prefix(max(0, maximumPending - state.pending.count)), at: 0)
                for (key, value) in counts {
                    let current = state.counts[key] ?? (0, 0)
                    state.counts[key] = (current.recorded + value.recorded, current.sampledOut + value.sampledOut)
                }
            }
        }
    }

    package func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: self.flushInterval) }
            } catch {
                break
            }
            await writeBatch()
        }
        // The last batch, unless cancelled outright (the database client may be gone), and bounded.
        if !Task.isCancelled {
            _ = try? await withDeadline(.seconds(5)) { await self.flush() }
        }
    }
}
