import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaWorkers
import Testing

/// A receiver plus effect workers driven by hand (`runOnce`), on one fresh database.
package struct EffectHarness {
    package let h: Harness
    package let workers: EffectWorkers
    package var client: PostgresClient { h.server.client }

    package init(h: Harness, workers: EffectWorkers) {
        self.h = h
        self.workers = workers
    }

    /// `server` adjusts the receiver's configuration (its API), `configure` the workers'.
    package static func start(
        _ configure: (inout EffectWorkers.Configuration) -> Void = { _ in }, server: (inout Configuration) -> Void = { _ in }
    ) async throws -> EffectHarness {
        let h = try await Harness.start(server)
        var configuration = EffectWorkers.Configuration()
        configuration.effects.workers = 1
        configure(&configuration)
        let workers = EffectWorkers(configuration: configuration, store: EffectStore(client: h.server.client, logger: h.logs.logger()), logger: h.logs.logger())
        return EffectHarness(h: h, workers: workers)
    }

    package func stop() async { await h.stop() }

    /// Runs worker 0 until nothing is ready at `now` (nil: PostgreSQL's time).
    @discardableResult
    package func drain(now: Date? = nil) async throws -> Int {
        var total = 0
        while true {
            let claimed = try await workers.effects[0].runOnce(now: now).claimed
            if claimed == 0 { return total }
            total += claimed
        }
    }

    /// One round of the callbacks deliverer; how many deliveries it claimed.
    @discardableResult
    package func deliverCallbacks() async throws -> Int { try await workers.deliverer(.callbacks)?.runOnce(http: .shared).claimed ?? 0 }

    /// One round of the alerts deliverer; how many messages it claimed.
    @discardableResult
    package func deliverAlerts() async throws -> Int { try await workers.deliverer(.alerts)?.runOnce(http: .shared).claimed ?? 0 }

    /// Test times are offsets in ms from this realistic base (Apple's event_time heuristics read
    /// small numbers as seconds).
    package static let base: Int64 = 1_700_000_000_000

    package func post(_ type: String, sub: String, at offset: Int64, email: String? = nil, jti: String = UUID().uuidString) async throws {
        let millis = Self.base + offset
        let jws = try h.signer.notification(
            aud: Harness.aud, type: type, sub: sub, eventTime: Date(timeIntervalSince1970: Double(millis) / 1000), email: email,
            isPrivateEmail: email == nil ? nil : true, jti: jti)
        let answer = try await h.server.post(jws: jws)
        #expect(answer.status == 200)
    }

    /// A session created at `millis` (as a backend would, with plain SQL).
    @discardableResult
    package func session(sub: String, createdAt offset: Int64) async throws -> String {
        let millis = Self.base + offset
        let id = UUID().uuidString.lowercased()
        try await client.query(
            "INSERT INTO sessions (id, aud, sub, created_at) VALUES (\(id)::uuid, \(Harness.aud), \(sub), timestamptz 'epoch' + \(Int(millis)) * interval '1 millisecond')")
        return id
    }

    package func activeSessions(sub: String) async throws -> Set<String> {
        var ids = Set<String>()
        for try await (id,) in try await client.query(
            "SELECT id::text FROM sessions WHERE aud = \(Harness.aud) AND sub = \(sub) AND revoked_at IS NULL"
        ).decode((String,).self) {
            ids.insert(id)
        }
        return ids
    }

    /// (forwarding, email, consent revoked at ms, deleted at ms)
    package func account(sub: String) async throws -> String {
        for try await (row,) in try await client.query(
            """
            SELECT concat_ws('|', coalesce(email_forwarding::text, '-'), coalesce(email, '-'), coalesce(is_private_email::text, '-'),
                coalesce(((extract(epoch FROM email_event_time) * 1000)::bigint - \(Self.base))::text, '-'),
                coalesce(((extract(epoch FROM consent_revoked_at) * 1000)::bigint - \(Self.base))::text, '-'),
                coalesce(((extract(epoch FROM deleted_at) * 1000)::bigint - \(Self.base))::text, '-'))
            FROM accounts WHERE aud = \(Harness.aud) AND sub = \(sub)
            """
        ).decode((String,).self) {
            return row
        }
        return "none"
    }
}
