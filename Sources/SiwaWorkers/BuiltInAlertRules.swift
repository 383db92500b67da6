import Foundation
import Prometheus
import SiwaDomain
import SiwaStore
import Synchronization

extension AlertRuleSettings {
    /// The built-in rules with these settings, each with what it reads, in the order they are
    /// evaluated (and `alerts silence --help` names them); `apps`: the apps `quiet_app` watches
    /// (empty: every app heard from). A rule's arithmetic and message are in its file in
    /// SiwaDomain; its reads are in the store of the tables it reads.
    package func builtInRules(apps: [String]) -> [any MonitoredAlertRule] {
        let resolveAfter = spike.resolveAfter
        return [
            ObservingRule(AppleCredentialsRule(resolveAfter: resolveAfter)) { source, now in
                let store = AppleTokenStore(client: source.client, logger: source.logger)
                let refused = try await store.callsRefused(with: .invalidClient, since: source.windowStart(now))
                source.metrics?.appleInvalidClient.set(Double(refused))
                return refused
            },
            ObservingRule(BadSignaturesRule(threshold: badSignatures, resolveAfter: resolveAfter)) { source, now in
                let rejected = try await RejectionStore(client: source.client, logger: source.logger).rejected(since: source.windowStart(now))
                source.metrics?.badSignatures.set(Double(BadSignaturesRule.count(rejected)))
                return rejected
            },
            ObservingRule(EndpointHealthRule(certificateDays: endpoint.certificateDays, resolveAfter: resolveAfter)) { [url = endpoint.url] source, _ in
                guard let url else { return nil }
                return try await EndpointCheckStore(client: source.client, logger: source.logger).latest(url: url.absoluteString)
            },
            ObservingRule(JobsDiscardedRule(threshold: discardedJobs, resolveAfter: resolveAfter)) { source, now in
                let discarded = try await JobQueue(client: source.client, logger: source.logger).discardedByLane(since: source.windowStart(now))
                source.metrics?.discarded.set(Double(discarded.values.reduce(0, +)))
                return discarded
            },
            ObservingRule(SuppressionTargetRule(threshold: suppressionFailing, resolveAfter: resolveAfter)) { source, now in
                try await JobQueue(client: source.client, logger: source.logger).suppressionsFailing(since: source.windowStart(now), now: now)
            },
            ObservingRule(QueueLagRule(threshold: queueLag, resolveAfter: resolveAfter)) { source, now in
                let lag = try await JobQueue(client: source.client, logger: source.logger).queueLag(now: now)
                source.metrics?.queueLag.set(Double(lag))
                return lag
            },
            ObservingRule(RevocationSpikeRule(settings: spike)) { source, now in
                let history = HistoryStore(client: source.client, logger: source.logger)
                let spikes = try await history.spikeCounts(now: now, window: source.window)
                return RevocationCounts(spikes: spikes, firstSeen: try await history.firstSeen(auds: Array(Set(spikes.map(\.aud)))))
            },
            ObservingRule(TransferDeadlineRule(settings: transferDeadline)) { source, now in
                var backlogs: [TransferBacklog] = []
                for (transfer, left) in try await TransferStore(client: source.client, logger: source.logger).backlogs(now: now) {
                    let key = TransferDeadlineRule.key(aud: transfer.aud, outgoing: transfer.direction == .outgoing, team: transfer.teamID)
                    backlogs.append(TransferBacklog(key: key, window: TransferWindow(transferredAt: transfer.transferredAt), usersLeft: left))
                }
                source.metrics?.record(transfers: backlogs.filter { $0.window.isOpen(at: now) })
                return backlogs
            },
            ObservingRule(QuietRule(settings: quiet), observe: QuietAppReads(apps: apps, minimumGap: quiet.minimumGap).observe),
        ]
    }
}

/// What `quiet_app` reads of every watched app: the history spans once an hour (they only change
/// when it turns), the last arrival and the rejections since it each round.
final class QuietAppReads: Sendable {
    let apps: [String]
    let minimumGap: Duration
    /// The history spans, by the end of the history they were read for.
    private let history = Mutex<(end: Date, spans: [String: [Int: Int]])?>(nil)

    init(apps: [String], minimumGap: Duration) {
        self.apps = apps
        self.minimumGap = minimumGap
    }

    @Sendable func observe(_ source: AlertSource, now: Date) async throws -> [AppActivity] {
        let store = HistoryStore(client: source.client, logger: source.logger)
        let arrivals = try await store.arrivals(auds: apps)
        guard !arrivals.isEmpty else { return [] }
        let window = QuietRule.history(now: now, firstSeen: .distantPast)
        let cached = history.withLock { $0?.end == window.upperBound ? $0?.spans : nil }
        let spans: [String: [Int: Int]]
        if let cached {
            spans = cached
        } else {
            spans = try await store.activeSpans(auds: arrivals.map(\.aud), history: window)
            history.withLock { $0 = (window.upperBound, spans) }
        }
        var apps: [AppActivity] = []
        for arrival in arrivals {
            var activity = AppActivity(
                aud: arrival.aud, firstSeen: arrival.firstSeen, lastArrival: arrival.lastArrival,
                history: QuietRule.history(now: now, firstSeen: arrival.firstSeen), activeSpans: spans[arrival.aud] ?? [:])
            // Rejections matter only to a gap long enough to fire (they name why it is quiet).
            if now.timeIntervalSince(arrival.lastArrival) >= minimumGap.timeInterval {
                activity.rejectedSince = try await RejectionStore(client: source.client, logger: source.logger).rejected(since: arrival.lastArrival)
            }
            apps.append(activity)
        }
        return apps
    }
}
