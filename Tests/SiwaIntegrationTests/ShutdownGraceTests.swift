import AsyncHTTPClient
import Foundation
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaTestSupport
import Testing

@Suite("SIGTERM past the grace period")
struct ShutdownGraceTests {
    @Test("A callback still in flight when SIWA_SHUTDOWN_GRACE runs out: the process is cut short and exits 1")
    func graceExceeded() async throws {
        let keys = try await DeployTests.Keys.make()
        defer { keys.remove() }
        let endpoint = try await CallbackEndpoint.start(hang: true)
        let databaseURL = try await CLITests.databaseURL()
        let port = CLITests.freePort()
        let environment = ProcessInfo.processInfo.environment.merging([
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": keys.aud, "SIWA_APPLE_JWKS_URL": keys.jwksURL,
            "SIWA_CALLBACK_URL": endpoint.url.absoluteString, "SIWA_CALLBACK_SECRET": CallbackTests.secret, "SIWA_CALLBACK_TIMEOUT": "120s",
            "SIWA_SHUTDOWN_GRACE": "1s", "SIWA_PORT": "\(port)", "SIWA_ADMIN_PORT": "\(CLITests.freePort())",
        ]) { $1 }
        let server = try Subprocess.start(CLITests.binary.path, ["serve"], environment: environment)
        #expect(await DeployTests.waitReady(port: port))
        let load = DeliveryLoad(bodies: try keys.bodies(count: 1, prefix: "grace"), ports: [port])
        await load.send()
        #expect(load.acknowledged.count == 1)
        // The effect is applied and its callback sent: the endpoint holds it open.
        let arrived = try await withDeadline(.seconds(60)) { await endpoint.arrivals.first { _ in true } != nil }
        #expect(arrived)
        let signalled = ContinuousClock.now
        server.signal(SIGTERM)
        let status = await server.waitForExit()  // the raw wait status: exit code 1, not a signal
        #expect(status & 0x7f == 0 && (status >> 8) & 0xff == 1, "wait status \(status)")
        // The grace period, then the cancellation bound (5 s): not the callback's 120 s timeout.
        #expect(ContinuousClock.now - signalled < .seconds(60))
        await endpoint.stop()
    }
}
