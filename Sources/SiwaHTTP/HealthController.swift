import Hummingbird
import SiwaDomain
import SiwaRuntime
import SiwaKeys
import SiwaStore

/// `/health/live` (the process answers) and `/health/ready` (database reachable and, for a process
/// that receives notifications, a key set loaded).
package struct HealthController: Sendable {
    let store: NotificationStore
    let keys: AppleKeyCache?
    let databaseTimeout: Duration

    package init(store: NotificationStore, keys: AppleKeyCache?, databaseTimeout: Duration) {
        self.store = store
        self.keys = keys
        self.databaseTimeout = databaseTimeout
    }

    package func register(on router: Router<SiwaRequestContext>) {
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
                if let reason = keys.notLoadedReason {
                    checks["apple_keys"] = .string(reason)
                    ready = false
                } else {
                    checks["apple_keys"] = .string("loaded")
                }
            }
            return Response.json(
                .object(["status": .string(ready ? "ready" : "unready"), "checks": .object(checks)]),
                status: ready ? .ok : .serviceUnavailable)
        }
    }
}
