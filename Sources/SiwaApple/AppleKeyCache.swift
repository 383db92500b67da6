import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
import SiwaDomain
import SiwaRuntime
import Synchronization

/// Where the last good key set survives restarts (PostgreSQL, keyed by source URL).
package protocol KeySetPersistence: Sendable {
    func loadKeySetDocument(sourceURL: String) async throws -> (document: String, fetchedAt: Date)?
    func saveKeySetDocument(sourceURL: String, document: String, fetchedAt: Date) async throws
}

/// Fetches a JWKS document from `https://…`, `http://…` or `file://…`.
package protocol KeySetFetcher: Sendable {
    func fetch(_ url: URL) async throws -> Data
}

/// The result of looking up a `kid`.
package enum KeyResolution: Sendable {
    case key(AppleKey)
    /// Still unknown after a fresh refresh: the token names a key Apple does not publish (401).
    case unknown(kid: String, known: [String])
    /// Could not find out now (fetch failed, or an unknown-kid refresh ran moments ago): Apple
    /// should retry (503 with Retry-After), by when the key is known.
    case unavailable(retryAfter: Duration, why: String)
}

/// Apple's signing keys: held in memory as an immutable snapshot, persisted in PostgreSQL with
/// their source URL, refreshed in the background, and refreshed at once when a token names a
/// `kid` we do not know — that is how Apple's key rotation shows up.
///
/// Unknown-kid refreshes are single-flight and rate limited (one per `unknownKidCooldown`;
/// scheduled refreshes don't count), so forged kids cannot become a fetch storm. A failed fetch
/// keeps the last good set.
package final class AppleKeyCache: Service, Sendable {
    package struct Configuration: Sendable {
        /// Where Sign in with Apple publishes its keys.
        package static let appleKeySetURL = URL(string: "https://appleid.apple.com/auth/keys")!

        package var sourceURL: URL
        package var refreshInterval: Duration
        package var unknownKidCooldown: Duration
        /// How soon to retry the scheduled fetch while no key set is loaded at all.
        package var retryWhileEmpty: Duration
        /// The longest a fetch (connect, headers and body) may take.
        package var fetchTimeout: Duration = .seconds(10)
        /// Past this age (since it was fetched from the source) a key set still verifies while
        /// Apple is unreachable, but readiness fails: a key Apple withdrew must not be trusted forever.
        package var maximumAge: Duration

        package init(
            sourceURL: URL = Configuration.appleKeySetURL, refreshInterval: Duration = .seconds(3600), unknownKidCooldown: Duration = .seconds(60), retryWhileEmpty: Duration = .seconds(15),
            maximumAge: Duration = .seconds(72 * 3600)
        ) {
            self.sourceURL = sourceURL
            self.maximumAge = maximumAge
            self.refreshInterval = refreshInterval
            self.unknownKidCooldown = unknownKidCooldown
            self.retryWhileEmpty = retryWhileEmpty
        }
    }

    private struct State: Sendable {
        var keys: AppleKeySet = .empty
        var loaded = false
        var lastUnknownKidRefresh: ContinuousClock.Instant?
        /// A fetch is under way (run by the caller that started it): those waiting for its result.
        var inFlight: [CheckedContinuation<Bool, Never>]?
        var lastFetchSucceeded = false
        var lastError: String?
        var fetches = 0
        /// When the set in use was fetched from the source (the persisted copy's time after a restart).
        var fetchedAt: Date?
    }

    package let configuration: Configuration
    private let fetcher: any KeySetFetcher
    private let persistence: (any KeySetPersistence)?
    private let logger: Logger
    private let state = Mutex(State())
    private let onRefresh: @Sendable (_ succeeded: Bool) -> Void
    private let clock: @Sendable () -> ContinuousClock.Instant
    /// Opens when start-up's `load` has finished, loaded or not.
    private let started = StartGate()

    /// `onRefresh` is told the outcome of every fetch from the source (metrics); `clock` times the
    /// unknown-kid cooldown.
    package init(
        configuration: Configuration, fetcher: any KeySetFetcher = DefaultKeySetFetcher(), persistence: (any KeySetPersistence)?, logger: Logger,
        onRefresh: @escaping @Sendable (_ succeeded: Bool) -> Void = { _ in }, clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }
    ) {
        self.onRefresh = onRefresh
        self.clock = clock
        self.configuration = configuration
        self.fetcher = fetcher
        self.persistence = persistence
        self.logger = logger
    }

    package var keys: AppleKeySet { state.withLock { $0.keys } }
    /// True once a key set is in memory (from the database or a fetch): readiness for a receiver.
    package var isLoaded: Bool { state.withLock { $0.loaded } }
    /// Fetch attempts so far (for tests and metrics).
    package var fetchAttempts: Int { state.withLock { $0.fetches } }

    /// Whether the cache can verify notifications, and if not why; `detail` is for operators only
    /// (the admin listener and the log): it names the source and the fetch error.
    package enum Readiness: Sendable, Equatable {
        case loaded
        /// Nothing fetched or stored yet, and no fetch has failed.
        case loading(detail: String)
        /// The last fetch failed with nothing loaded, or the set in use is older than `maximumAge`.
        case unavailable(detail: String)

        /// What the public listener may say: no URL, no error text.
        package var publicWord: String {
            switch self {
            case .loaded: "loaded"
            case .loading: "loading"
            case .unavailable: "unavailable"
            }
        }
    }

    package func readiness(now: Date = Date()) -> Readiness {
        let (loaded, lastError, fetchedAt) = state.withLock { ($0.loaded, $0.lastError, $0.fetchedAt) }
        if loaded {
            if let fetchedAt, let stale = staleness(fetchedAt: fetchedAt, now: now, lastError: lastError) { return .unavailable(detail: stale) }
            return .loaded
        }
        if let lastError { return .unavailable(detail: "not loaded: \(lastError)") }
        return .loading(detail: "not loaded yet: fetching \(sourceForLogs)")
    }

    /// Why the cache is not ready (nil when it is), for operators.
    package var notLoadedReason: String? {
        switch readiness() {
        case .loaded: nil
        case .loading(let detail), .unavailable(let detail): detail
        }
    }

    private func staleness(fetchedAt: Date, now: Date, lastError: String?) -> String? {
        let age = now.timeIntervalSince(fetchedAt)
        let limit = Double(configuration.maximumAge.components.seconds)
        guard age > limit else { return nil }
        return "the key set in use was fetched \(Int(age / 3600)) h ago, past SIWA_JWKS_MAX_AGE (\(Int(limit / 3600)) h)"
            + (lastError.map { "; the last fetch failed: \($0)" } ?? "")
    }

    /// Returns once start-up's `load` has finished (loaded or not).
    package func waitUntilStarted() async { await started.wait() }

    /// When the key set in use was fetched from its source (nil: none loaded).
    package var fetchedAt: Date? { state.withLock { $0.fetchedAt } }
    /// The persistence key: the URL whole (never logged).
    private var sourceKey: String { configuration.sourceURL.absoluteString }
    /// The URL as logs and messages show it (userinfo hidden).
    private var sourceForLogs: String { URLRedaction.redacted(configuration.sourceURL) }

    /// Start-up: the persisted set for this source URL first (so a restart works while Apple is
    /// unreachable), then a fresh fetch. Never throws: an empty cache just isn't ready.
    package func load() async {
        defer { started.open() }
        logger.notice("loading apple keys", metadata: ["source": "\(sourceForLogs)"])
        if let persistence {
            do {
                if let stored = try await persistence.loadKeySetDocument(sourceURL: sourceKey) {
                    let keys = try AppleKeySet.parse(Data(stored.document.utf8))
                    state.withLock {
                        $0.keys = keys
                        $0.loaded = true
                        $0.fetchedAt = stored.fetchedAt
                    }
                    logger.info("apple keys loaded from database", metadata: ["kids": "\(keys.kids.joined(separator: ","))", "fetched_at": "\(stored.fetchedAt)"])
                }
            } catch {
                logger.warning("stored apple keys unusable", metadata: ["error": "\(String(reflecting: error))"])
            }
        }
        _ = await refresh(reason: "startup")
    }

    /// Looks up `kid`, refreshing once (single-flight, rate limited) when it is unknown.
    package func resolve(kid: String) async -> KeyResolution {
        let (found, loaded) = state.withLock { ($0.keys[kid], $0.loaded) }
        if let found { return .key(found) }
        // Before start-up's load has finished, nothing is known yet: no key is "unknown" (401).
        if !loaded && !started.isOpen {
            return .unavailable(retryAfter: configuration.retryWhileEmpty, why: "Apple's key set is not loaded yet (fetching \(sourceForLogs))")
        }
        let now = clock()
        enum Plan { case join, lead, coolingDown(Duration) }
        let plan: Plan = state.withLock { state in
            if state.inFlight != nil { return .join }
            if let last = state.lastUnknownKidRefresh, now - last < configuration.unknownKidCooldown {
                return .coolingDown(configuration.unknownKidCooldown - (now - last))
            }
            state.lastUnknownKidRefresh = now
            Self.startFetch(&state)
            return .lead
        }
        let fetched: Bool
        switch plan {
        case .coolingDown(let remaining):
            // Refreshed within the cooldown: a kid still unknown is not Apple's (401, recorded).
            // Only when that refresh failed can a retry help.
            let (succeeded, keys, lastError) = state.withLock { ($0.lastFetchSucceeded, $0.keys, $0.lastError) }
            if succeeded { return .unknown(kid: kid, known: keys.kids) }
            return .unavailable(
                retryAfter: remaining,
                why: "kid \(UntrustedText.bounded(kid)) is unknown and Apple's key set could not be fetched moments ago: \(lastError ?? "unknown error"); retry later")
        case .join: fetched = await join()
        case .lead: fetched = await fetchAndSwap(reason: "unknown kid")
        }
        let (keys, lastError) = state.withLock { ($0.keys, $0.lastError) }
        if let key = keys[kid] { return .key(key) }
        if !fetched {
            return .unavailable(retryAfter: configuration.unknownKidCooldown, why: "kid \(UntrustedText.bounded(kid)) is unknown and Apple's key set could not be fetched: \(lastError ?? "unknown error")")
        }
        return .unknown(kid: kid, known: keys.kids)
    }

    /// Fetches now (joining a fetch already under way). Returns whether the fetch succeeded.
    @discardableResult
    package func refresh(reason: String) async -> Bool {
        let lead = state.withLock { state in
            guard state.inFlight == nil else { return false }
            Self.startFetch(&state)
            return true
        }
        return lead ? await fetchAndSwap(reason: reason) : await join()
    }

    /// Single flight without a task of its own: the caller that finds no fetch under way runs
    /// it; later callers wait for its result.
    private static func startFetch(_ state: inout State) {
        state.fetches += 1
        state.inFlight = []
    }

    /// Waits for the fetch under way (or takes the last result if it has just finished).
    private func join() async -> Bool {
        await withCheckedContinuation { continuation in
            let done: Bool? = state.withLock { state in
                guard state.inFlight != nil else { return state.lastFetchSucceeded }
                state.inFlight?.append(continuation)
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }

    /// Ends the fetch under way: its waiters get `succeeded`.
    private func finishFetch(_ state: inout State, succeeded: Bool) -> [CheckedContinuation<Bool, Never>] {
        defer { state.inFlight = nil }
        state.lastFetchSucceeded = succeeded
        return state.inFlight ?? []
    }

    private func fetchAndSwap(reason: String) async -> Bool {
        let started = ContinuousClock.now
        let outcome: Result<AppleKeySet, any Error>
        do {
            let fetcher = self.fetcher
            let url = configuration.sourceURL
            // The whole fetch, body included, under one deadline: a trickling response must not
            // hold the single in-flight refresh (and every request waiting on it).
            let document = try await withDeadline(configuration.fetchTimeout) { try await fetcher.fetch(url) }
            outcome = .success(try AppleKeySet.parse(document))
        } catch {
            outcome = .failure(error)
        }
        let elapsed = ContinuousClock.now - started
        switch outcome {
        case .success(let keys):
            let waiters = state.withLock {
                $0.keys = keys
                $0.loaded = true
                $0.lastError = nil
                $0.fetchedAt = Date()
                return finishFetch(&$0, succeeded: true)
            }
            for waiter in waiters { waiter.resume(returning: true) }
            onRefresh(true)
            // (Persisted after the swap; the upsert keeps the newest fetched_at, so two refreshes
            // finishing out of order cannot put an older set back.)
            logger.info(
                "apple keys fetched",
                metadata: ["reason": "\(reason)", "kids": "\(keys.kids.joined(separator: ","))", "duration_ms": "\(elapsed.milliseconds)"])
            if let persistence {
                do {
                    try await persistence.saveKeySetDocument(
                        sourceURL: sourceKey, document: String(decoding: keys.document, as: UTF8.self), fetchedAt: Date())
                } catch {
                    logger.warning("could not persist apple keys", metadata: ["error": "\(String(reflecting: error))"])
                }
            }
            return true
        case .failure(let error):
            let message = URLRedaction.scrubbed("\(error)")
            let waiters = state.withLock {
                $0.lastError = message
                return finishFetch(&$0, succeeded: false)
            }
            for waiter in waiters { waiter.resume(returning: false) }
            onRefresh(false)
            logger.warning(
                "apple keys fetch failed; keeping the last good set",
                metadata: ["reason": "\(reason)", "source": "\(sourceForLogs)", "error": "\(message)"])
            if case .unavailable(let detail) = readiness() {
                logger.error("apple keys unusable: readiness fails until a fetch succeeds", metadata: ["why": "\(detail)"])
            }
            return false
        }
    }

    /// What one scheduled refresh did.
    package enum Refresh: Sendable, Equatable {
        case fetched
        /// The fetch failed; the last good set (if any) stays in use.
        case failed
    }

    /// One scheduled refresh.
    @discardableResult
    package func runOnce() async -> Refresh {
        await refresh(reason: "scheduled") ? .fetched : .failed
    }

    /// The next scheduled refresh: every `refreshInterval`, more often while nothing is loaded.
    private var nextRefresh: Duration { isLoaded ? configuration.refreshInterval : configuration.retryWhileEmpty }

    /// Start-up's `load` (in the background: the listeners do not wait for Apple), then scheduled
    /// refreshes until graceful shutdown, the first one interval after it.
    package func run() async throws {
        await cancelWhenGracefulShutdown { await self.load() }
        if Task.isCancelled || Task.isShuttingDownGracefully { return }
        var schedule = Schedule(interval: configuration.refreshInterval)
        schedule.firstWait = nextRefresh
        await Scheduler.run(schedule, once: { await self.runOnce() }, pace: { _ in .after(self.nextRefresh) }) { _ in }
    }
}
