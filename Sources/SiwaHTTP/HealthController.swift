import Hummingbird
import SiwaApple
import SiwaDomain
import SiwaRuntime
import SiwaStore

/// `/health/live` (the process answers) and `/health/ready` (database reachable and, for a process
/// that receives notifications, a usable key set). On the public listener the key set's state is
/// one word (`loaded`, `loading`, `unavailable`); the key-set URL and fetch errors are for the
/// admin listener only.
package struct HealthController: Sendable {
    let store: NotificationStore
    let keys: AppleKeyCache?
    let databaseTimeout: Duration

    package init(store: NotificationStore, keys: AppleKeyCache?, databaseTimeout: Duration) {
        self.store = store
        self.keys = keys
        self.databaseTimeout = databaseTimeout
    }

    /// Which listener the routes are on: what an answer may disclose.
    package enum Audience: Sendable { case publicListener, admin }

    package func register(on router: Router<SiwaRequestContext>, for audience: Audience) {
        router.get("/health/live") { _, _ in Response.json(.object(["status": .string("live")])) }
        router.get("/health/ready") { _, _ in
            var checks: [String: JSONValue] = [:]
            var ready = true
            do {
                try await withDeadline(databaseTimeout) { try await store.ping() }
                checks["database"] = .string("ok")
            } catch {
                checks["database"] = .string("unreachable")
                ready = false
            }
            if let keys {
                let readiness = keys.readiness()
                switch (readiness, audience) {
                case (.loaded, _): break
                case (.loading, _), (.unavailable, _): ready = false
                }
                switch (readiness, audience) {
                case (.loading(let detail), .admin), (.unavailable(let detail), .admin): checks["apple_keys"] = .string(detail)
                default: checks["apple_keys"] = .string(readiness.publicWord)
                }
            }
            return Response.json(
                .object(["status": .string(ready ? "ready" : "unready"), "checks": .object(checks)]),
                status: ready ? .ok : .serviceUnavailable)
        }
    }
}
