import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Synchronization
import Testing

/// The promise behind every 200: the notification and its job were durably committed first.
@Suite("Hard kill under load", .timeLimit(.minutes(10)))
struct HardKillTests {
    @Test("SIGKILL of the server (and of its PostgreSQL) under concurrent load: every acknowledged notification and its job are in the store")
    func acknowledgedSurviveHardKill() async throws {
        let directory = try TestBinary.makeDirectory("kill")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(try await TestBinary.run(["keys", "generate", "--dir", "keys"], directory: directory).status == 0)
        let signer = try AppleStyleSigner(pem: String(contentsOfFile: "\(directory)/keys/private-key.pem", encoding: .utf8))
        let aud = "com.example.kill"
        let types = ["email-disabled", "email-enabled", "consent-revoked", "account-delete"]
        let count = 2_000
        let bodies = try (0..<count).map { index in
            let type = types[index % types.count]
            return AppleStyleSigner.body(
                try signer.notification(
                    aud: aud, type: type, sub: "001.kill.\(index % 150)", eventTime: Date().addingTimeInterval(Double(index) / 1000),
                    email: type.hasPrefix("email") ? "kill\(index)@privaterelay.appleid.com" : nil, isPrivateEmail: type.hasPrefix("email") ? true : nil,
                    jti: "kill-\(index)"))
        }

        // The real binary, role all (receiver and workers commit concurrently), durable embedded
        // PostgreSQL under ./.siwa as a user runs it.
        let serving = try await TestBinary.startServing(
            environment: ["SIWA_APPLE_BUNDLE_IDS": aud, "SIWA_APPLE_JWKS_URL": "file://\(directory)/keys/jwks.json"], directory: directory)
        let server = serving.process
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let url = "http://127.0.0.1:\(serving.port)/apple/notifications"

        // 32 concurrent senders; the server is killed once 600 answers have come back.
        let load = Load()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withTaskGroup(of: Void.self) { senders in
                    for _ in 0..<32 {
                        senders.addTask {
                            while true {
                                let index = load.next.withLock { value -> Int? in
                                    defer { value += 1 }
                                    return value < count ? value : nil
                                }
                                guard let index, !load.killed.withLock({ $0 }) else { return }
                                var request = HTTPClientRequest(url: url)
                                request.method = .POST
                                request.headers.add(name: "Content-Type", value: "application/json")
                                request.body = .bytes(ByteBuffer(string: bodies[index]))
                                guard let response = try? await http.execute(request, timeout: .seconds(10)),
                                    let body = try? await response.body.collect(upTo: 1 << 16)
                                else { continue }
                                if response.status == .ok, String(buffer: body).contains(#""status":"accepted""#) {
                                    load.acknowledged.withLock { $0.append("kill-\(index)") }
                                    load.progress.add()
                                }
                            }
                        }
                    }
                }
                load.progress.close()
            }
            let reached = await load.progress.wait(until: 600)
            #expect(reached, "the load ended after \(load.progress.value) acknowledgements, before 600")
            server.signal(SIGKILL)
            load.killed.withLock { $0 = true }
        }
        _ = await server.waitForExit()
        try await http.shutdown()
        // Its PostgreSQL goes down hard too (no shutdown checkpoint): only the WAL brings the
        // commits back.
        try await PostmasterCrash.kill(pgdata: "\(directory)/.siwa/pgdata")

        let acked = load.acknowledged.withLock { $0 }
        #expect(acked.count >= 600)
        #expect(acked.count < count)  // killed mid-load, not after it

        // Crash recovery, then look.
        let cluster = EmbeddedPostgres(options: .init(dataDirectory: "\(directory)/.siwa", durable: true), logger: Logger(label: "hard-kill"))
        let connection = try await cluster.start()
        let client = PostgresClient(
            configuration: .init(unixSocketPath: connection.socketPath, username: connection.username, password: nil, database: connection.database))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            var stored = Set<String>()
            for try await (jti,) in try await client.query(
                "SELECT n.jti FROM notifications n JOIN jobs j ON j.notification_id = n.id AND j.lane = 'effects' WHERE n.jti = ANY(\(acked))"
            ).decode((String,).self) {
                stored.insert(jti)
            }
            let lost = Set(acked).subtracting(stored)
            #expect(lost.isEmpty, "acknowledged but not in the store (with its job) after the kill: \(lost.sorted().prefix(10))")
            // No notification without its job, whatever was in flight.
            for try await (orphans,) in try await client.query(
                "SELECT count(*) FROM notifications n WHERE n.status <> 'skipped' AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.notification_id = n.id AND j.lane = 'effects')"
            ).decode((Int,).self) {
                #expect(orphans == 0)
            }
            group.cancelAll()
        }
        try await cluster.stop()
    }
}

private final class Load: Sendable {
    let acknowledged = Mutex<[String]>([])
    let next = Mutex(0)
    let killed = Mutex(false)
    let progress = Progress()
}
