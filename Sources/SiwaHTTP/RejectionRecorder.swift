import Foundation
import Logging
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import SiwaStore
import Synchronization

/// Records rejected deliveries off the request path: sampled (see `RejectionSampler`), buffered,
/// and written in batches with per-minute counts. A rejection is an answer already given, so its
/// record may trail by up to `flushInterval`; the buffer is bounded so a flood costs bounded memory.
/// Only failures that can heal (`canHeal`) keep rows for a later batch; a row the database refuses
/// for its content is dropped and counted (`siwa_rejections_dropped_total`), and the counts are
/// written on their own, so no row can stop the recording.
package final class RejectionRecorder: Service, Sendable {
    /// What one write did.
    package struct Written: Sendable, Equatable {
        /// Rows written.
        package var rows = 0
        /// Rows the database refused for their content (dropped, counted).
        package var dropped = 0
        /// Rows kept for the next write (the database failed in a way that can heal).
        package var kept = 0
        /// Minute counts written.
        package var minutes = 0

        package init(rows: Int = 0, dropped: Int = 0, kept: Int = 0, minutes: Int = 0) {
            (self.rows, self.dropped, self.kept, self.minutes) = (rows, dropped, kept, minutes)
        }
    }

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

    package init(
        store: RejectionStore, limitPerMinute: Int, tokensPerAudiencePerHour: Int = RejectionSampler.defaultTokensPerAudiencePerHour, flushInterval: Duration = .seconds(1),
        maximumPending: Int = 10_000, metrics: ReceiverMetrics?, logger: Logger
    ) {
        self.store = store
        self.flushInterval = flushInterval
        self.maximumPending = maximumPending
        self.metrics = metrics
        self.logger = logger
        self.state = Mutex(State(sampler: RejectionSampler(limitPerMinute: limitPerMinute, tokensPerAudiencePerHour: tokensPerAudiencePerHour)))
    }

    /// Takes a rejection: buffered for the next batch, or only counted. Never blocks on I/O.
    package func record(_ record: RejectionRecord) {
        let key = CountKey(minute: RejectionSampler.minute(of: record.receivedAt), reason: record.reason)
        let admitted = state.withLock { state in
            let admission = state.sampler.admit(record.reason, at: record.receivedAt, genuineTokenAudience: record.token == nil ? nil : record.aud ?? "")
            let admitted = admission != .counted && state.pending.count < maximumPending
            if admitted {
                var record = record
                if admission == .row { (record.token, record.keyJWK) = (nil, nil) }
                state.pending.append(record)
            }
            var count = state.counts[key] ?? (0, 0)
            if admitted { count.recorded += 1 } else { count.sampledOut += 1 }
            state.counts[key] = count
            return admitted
        }
        metrics?.count(rejected: record.reason)
        if !admitted { metrics?.count(sampledOut: record.reason) }
    }

    /// Writes what is buffered, and returns once every batch taken so far (also by a concurrent
    /// flush) is written. What failed in a way that can heal is put back (within the bound).
    package func flush() async {
        await runOnce()
        while state.withLock({ $0.writing > 0 }) {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// Writes one batch: what is buffered now, and the counts.
    @discardableResult
    package func runOnce() async -> Written {
        let (records, counts) = state.withLock { state in
            defer {
                state.pending.removeAll(keepingCapacity: true)
                state.counts.removeAll(keepingCapacity: true)
                state.writing += 1
            }
            return (state.pending, state.counts)
        }
        defer { state.withLock { $0.writing -= 1 } }
        var written = Written()
        guard !records.isEmpty || !counts.isEmpty else { return written }
        var keep: (records: [RejectionRecord], counts: [CountKey: (recorded: Int, sampledOut: Int)]) = ([], [:])
        do {
            try await store.insert(records)
            written.rows = records.count
        } catch {
            // One unacceptable row must not block every later batch: insert row by row, dropping
            // what the database refuses for its content; if the database itself failed, keep the
            // rest for later.
            logger.warning("could not write rejection records as a batch", metadata: ["count": "\(records.count)", "error": "\(loggable(error))"])
            let (remaining, dropped) = await store.insertIndividually(records)
            if dropped > 0 { metrics?.count(droppedRejections: dropped) }
            keep.records = remaining
            (written.rows, written.dropped, written.kept) = (records.count - remaining.count - dropped, dropped, remaining.count)
        }
        do {
            try await store.add(counts.map { RejectionCount(minute: $0.key.minute, reason: $0.key.reason, recorded: $0.value.recorded, sampledOut: $0.value.sampledOut) })
            written.minutes = counts.count
        } catch where canHeal(error) {
            logger.warning("could not write rejection counts; kept for the next batch", metadata: ["error": "\(loggable(error))"])
            keep.counts = counts
        } catch {
            logger.error("rejection counts refused by the database; dropped", metadata: ["minutes": "\(counts.count)", "error": "\(loggable(error))"])
        }
        guard !keep.records.isEmpty || !keep.counts.isEmpty else { return written }
        state.withLock { state in
            state.pending.insert(contentsOf: keep.records.prefix(max(0, maximumPending - state.pending.count)), at: 0)
            for (key, value) in keep.counts {
                let current = state.counts[key] ?? (0, 0)
                state.counts[key] = (current.recorded + value.recorded, current.sampledOut + value.sampledOut)
            }
        }
        return written
    }

    /// Writes a batch every `flushInterval` until graceful shutdown, then the last one.
    package func run() async throws {
        var schedule = Schedule(interval: flushInterval)
        schedule.firstWait = flushInterval
        await Scheduler.run(schedule, once: { await self.runOnce() }) { _ in }
        // The last batch, unless cancelled outright (the database client may be gone), and bounded.
        if !Task.isCancelled {
            _ = try? await withDeadline(.seconds(5)) { await self.flush() }
        }
    }
}
