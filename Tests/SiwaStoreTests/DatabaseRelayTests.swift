import Foundation
import Logging
import PostgresNIO
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import Testing

/// DATABASE_URL's hosts as the pool reaches them: parsed as libpq writes them, tried in order,
/// and left within seconds when one stops answering.
@Suite("Database relay: a host list, and a host that stops answering", .timeLimit(.minutes(10)))
struct DatabaseRelayTests {
    @Test("A host list parses as libpq writes it; a host it cannot read, or an unsupported target_session_attrs, is named")
    func hostLists() throws {
        let target = try DatabaseURL.target("postgres://u:p%40ss@db1:5433,db2,[::1]:6000/app?sslmode=require&target_session_attrs=read-write")
        guard case .hosts(let hosts, let tls) = target.place else { Issue.record("not hosts"); return }
        #expect(hosts == [DatabaseHost(name: "db1", port: 5433), DatabaseHost(name: "db2", port: 5432), DatabaseHost(name: "::1", port: 6000)])
        #expect(tls == .require && target.sessionAttributes == .readWrite)
        #expect(target.username == "u" && target.password == "p@ss" && target.database == "app")
        #expect(DatabaseURL.redacted("postgres://u:secret@db1:5433,db2/app") == "postgres://u:***@db1:5433,db2:5432/app")
        #expect(throws: DatabaseURL.InvalidURL.self) { try DatabaseURL.target("postgres://u@db1,,db2/app") }
        do {
            _ = try DatabaseURL.target("postgres://u@db1,db2/app?target_session_attrs=standby")
            Issue.record("accepted")
        } catch {
            #expect(error.description.contains("target_session_attrs standby is not supported; use any, read-write or primary"))
        }
        // One host: as before.
        guard case .hosts(let one, _) = try DatabaseURL.target("postgres://u@db:5999/app").place else { return }
        #expect(one == [DatabaseHost(name: "db", port: 5999)])
    }

    @Test("A host that goes silent with its sockets held open is left within seconds: the waiting statement fails, the next runs on the next host")
    func silentHostIsLeft() async throws {
        // A cluster of its own: the shared one, loaded by the rest of the suite, may refuse
        // connections meanwhile, which is another test's subject.
        let cluster = try await OwnCluster.start(label: "relay")
        let socket = try #require(cluster.database.unixSocketPath)
        let first = TCPProxy(target: socket)
        let second = TCPProxy(target: socket)
        let hosts = [DatabaseHost(name: "127.0.0.1", port: try await first.start()), DatabaseHost(name: "127.0.0.1", port: try await second.start())]
        let relay = try DatabaseRelay(hosts: hosts, tls: .disable, attributes: .any, logger: Logger(label: "relay"))
        try await relay.start()
        let client = PostgresClient(
            configuration: .init(unixSocketPath: relay.socketPath, username: cluster.database.username, password: nil, database: cluster.database.database))
        try await withThrowingTaskGroup(of: Void.self) { group async throws -> Void in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            func select(_ n: Int) async -> Int? {
                do { return try await TestBinary.count(client, "SELECT \(n)::bigint") } catch {
                    Issue.record("SELECT \(n): \(String(reflecting: error))")
                    return nil
                }
            }
            #expect(await select(1) == 1)
            #expect(relay.currentHost == hosts[0])

            first.silence()
            let started = ContinuousClock.now
            // The pool's connection to the silent host takes the next statement and waits; the
            // relay's probe finds no answer and ends it (FATAL 08006). As a store does, the caller
            // bounds each call and tries again after an error: postgres-nio 1.33 can still lose a
            // statement on a connection ended under it (see `BoundedPostgres`), which then costs
            // that call its bound, here 8 s; the next call's new connection goes to the next host.
            var answered: Int?
            var errors: [String] = []
            while answered == nil, ContinuousClock.now - started < .seconds(30) {
                do {
                    answered = try await withDeadline(.seconds(8)) { try await TestBinary.count(client, "SELECT 2::bigint") }
                } catch {
                    errors.append("\(error)")
                }
            }
            let back = ContinuousClock.now - started
            #expect(answered == 2)
            #expect(relay.currentHost == hosts[1])
            #expect(back < .seconds(15), "back after \(back); errors meanwhile: \(errors)")
        }
        await relay.stop()
        await first.stop()
        await second.stop()
        await cluster.stopAndRemove()
    }
}
