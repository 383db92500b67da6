import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// An app transfer of 2,000 users through the real binary against `standin serve`, each phase
/// SIGKILLed once it has made progress and then rerun: what a crash costs is one call to Apple,
/// never a user lost or moved twice. The 10,000-user run, timed, is `scripts/bench transfer`
/// (BENCHMARKS.md): a benchmark does not belong in the suite's time.
@Suite("Transfers at scale", .timeLimit(.minutes(10)))
struct TransferScaleTests {
    static let recipient = "TEAMB23456"
    static let aud = "com.example.app"
    static let users = 2_000
    /// Calls to Apple in flight in each command (`--concurrency`).
    static let concurrency = 4
    /// Marked revoked at the stand-in before `prepare`: Apple refuses their transfer_sub.
    static let revokedBefore = [17, 500, 1_003, 1_555, 1_999]
    /// Marked revoked after `export`: prepared, then refused by the exchange.
    static let revokedAfter = [42, 848, 1_777]
    /// Apple's 429s the stand-in is told to answer first, each waited out a second: the first
    /// five in a row stop a run (`AppleGateway.rateLimitedAttempts`), the sixth is waited out.
    static let injected429s = 6
    /// Progress (users done) at which a phase is killed.
    static let killAt = 400

    /// User `index`'s sub in the sending team, shaped as Apple's.
    static func sub(_ index: Int) -> String {
        let hex = Insecure.MD5.hash(data: Data("scale\(index)".utf8)).map { String(format: "%02x", $0) }.joined()
        return String(format: "%06d", index) + ".\(hex).0001"
    }

    @Test(
        "2,000 users, prepare → export → import → exchange (own database and in place), each phase killed midway and rerun: every account, session, history row and queued job re-keyed once, none lost; refusals and 429s reported",
        .timeLimit(.minutes(6)))
    func transferAtScale() async throws {
        let clock = ContinuousClock()
        let testStarted = clock.now
        var timings: [(String, Duration)] = []
        let directory = try TestBinary.makeDirectory("transfer-scale")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The limit equals the highest --rate: the CLI's pacing alone keeps it under, so every
        // 429 is one the test injected.
        let standIn = try await StandInProcess.start(
            in: directory, arguments: ["--recipient-team-id", Self.recipient, "--recipient-key-id", "KEYB234567", "--migration-rate", "1000"])
        defer { standIn.process.signal(SIGKILL) }

        // The sending team's database: the app's users, each with sessions and history.
        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let databaseURL = "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"
        let client = PostgresClient(configuration: database)
        let running = Task { await client.run() }
        defer { running.cancel() }
        var started = clock.now
        try await Self.load(client)
        timings.append(("load \(Self.users) users", clock.now - started))
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE aud = '\(Self.aud)'") == Self.users)
        let totals = try await Self.totals(client)
        // A session each and a second for every third; two notifications each and a pending one for every tenth.
        #expect(totals == Totals(sessions: Self.users + Self.users / 3, notifications: 2 * Self.users + Self.users / 10, jobs: Self.users / 10), "\(totals)")

        for index in Self.revokedBefore { try await Self.revoke(Self.sub(index), at: standIn) }
        let environment = [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": Self.aud, "SIWA_APPLE_TEAM_ID": StandInProcess.teamID,
            "SIWA_APPLE_KEY_ID": StandInProcess.keyID, "SIWA_APPLE_PRIVATE_KEY_FILE": StandInProcess.keyFile(in: directory),
            "SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey(), "SIWA_APPLE_AUTH_URL": standIn.base,
        ]

        // Prepare: Apple answers 429 five times in a row (the run stops, saying so, having kept
        // nothing), then once more (waited out); killed once 2,000 users have theirs; rerun.
        var failure = HTTPClientRequest(url: "\(standIn.base)/standin/failures")
        failure.method = .POST
        failure.headers.add(name: "Content-Type", value: "application/json")
        failure.body = .bytes(ByteBuffer(string: #"{"endpoint": "usermigrationinfo", "status": 429, "count": \#(Self.injected429s)}"#))
        #expect(try await HTTPClient.shared.execute(failure, timeout: .seconds(30)).status.code == 204)
        let prepare = ["transfers", "prepare", "--target", Self.recipient, "--rate", "1000", "--concurrency", "\(Self.concurrency)"]
        started = clock.now
        let limited = try await TestBinary.run(prepare, environment: environment, directory: directory)
        #expect(limited.status == 1, "\(limited.stdout) \(limited.stderr)")
        #expect(
            limited.stderr.contains("stopped with \(Self.users) users left: Apple kept limiting the rate (HTTP 429): rerun with a lower --rate to resume"),
            "\(limited.stderr)")
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE transfer_sub IS NOT NULL OR error IS NOT NULL") == 0)
        let preparing = try await Self.killMidway(prepare, environment: environment, directory: directory) {
            try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE transfer_sub IS NOT NULL")
        }
        #expect(preparing.killed, "prepare finished before it could be killed: \(preparing.output)")
        let prepared = try await TestBinary.run(prepare, environment: environment, directory: directory)
        timings.append(("prepare (killed at \(preparing.progress), rerun)", clock.now - started))
        #expect(prepared.status == 0, "\(prepared.stdout) \(prepared.stderr)")
        let computed = Self.users - Self.revokedBefore.count
        #expect(prepared.stdout.contains("\(computed) of \(Self.users) users have a transfer_sub for team \(Self.recipient)"), "\(prepared.stdout)")
        #expect(prepared.stdout.contains("\(Self.revokedBefore.count) refused by Apple: invalid_request"), "\(prepared.stdout)")
        // One row per user, one identifier each, every one asked for once (the rerun skipped what
        // the killed run had kept); the refused kept with Apple's word, not retried.
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs") == Self.users)
        #expect(try await Self.count(client, "SELECT count(DISTINCT sub) FROM transfer_subs") == Self.users)
        #expect(try await Self.count(client, "SELECT count(DISTINCT transfer_sub) FROM transfer_subs") == computed)
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE attempts <> 1") == 0, "a user asked twice, or not at all")
        let refused = try await Self.strings(client, "SELECT sub FROM transfer_subs WHERE error = 'invalid_request' ORDER BY sub")
        #expect(refused == Self.revokedBefore.map(Self.sub).sorted())
        // Apple's side of it: each user asked once, plus at most the calls in flight at the kill;
        // the injected 429s waited out and recorded, and no other (the pacing kept to the limit).
        let asked = try await Self.calls(client)
        #expect((Self.users...Self.users + Self.concurrency).contains(asked.answered), "\(asked)")
        #expect(asked.tooMany == Self.injected429s, "\(asked)")
        let status = try await TestBinary.run(["transfers", "status"], environment: ["DATABASE_URL": databaseURL], directory: directory)
        #expect(
            status.stdout.contains("\(computed)/\(Self.users) transfer_subs, refused: \(Self.revokedBefore.count) invalid_request, 0 pending"),
            "\(status.stdout)")

        // Export: the header and one transfer_sub a line, no sub.
        let file = "\(directory)/transfer.ndjson"
        started = clock.now
        let exported = try await TestBinary.run(
            ["transfers", "export", "--target", Self.recipient, "--output", file], environment: environment, directory: directory)
        timings.append(("export", clock.now - started))
        #expect(exported.status == 0 && exported.stdout.contains("wrote \(computed) transfer_subs"), "\(exported.stdout) \(exported.stderr)")
        let lines = try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == computed + 1)
        let values = Set(lines.dropFirst().compactMap { JSONValue.parse(Data($0.utf8))?["transfer_sub"]?.stringValue })
        #expect(values.count == computed)
        #expect(values.isDisjoint(with: (1...Self.users).map(Self.sub)) && !lines.contains { $0.contains("privaterelay") })

        // Import into the receiving team's own database: one statement, so a kill leaves all or
        // nothing; run twice, the second adds nothing.
        let other = try await TestCluster.shared.makeDatabase()
        let otherURL = "postgres://\(other.username)@/\(other.database ?? "")?host=\(socketDirectory)"
        let otherClient = PostgresClient(configuration: other)
        let otherRunning = Task { await otherClient.run() }
        defer { otherRunning.cancel() }
        let recipient = environment.merging([
            "SIWA_APPLE_TEAM_ID": Self.recipient, "SIWA_APPLE_KEY_ID": "KEYB234567", "SIWA_APPLE_PRIVATE_KEY_FILE": "\(directory)/keys/AuthKey_KEYB234567.p8",
        ]) { $1 }
        var receiving = recipient
        receiving["DATABASE_URL"] = otherURL
        let importing = ["transfers", "import", file, "--from", StandInProcess.teamID]
        started = clock.now
        let imported = try await TestBinary.run(importing, environment: receiving, directory: directory)
        timings.append(("import", clock.now - started))
        #expect(imported.status == 0 && imported.stdout.contains("imported \(computed) transfer_subs from team \(StandInProcess.teamID) (\(computed) new)"), "\(imported.stdout) \(imported.stderr)")
        let again = try await TestBinary.run(importing, environment: receiving, directory: directory)
        #expect(again.status == 0 && again.stdout.contains("(0 new)"), "\(again.stdout) \(again.stderr)")
        #expect(try await Self.count(otherClient, "SELECT count(*) FROM transfer_imports") == computed)
        #expect(try await Self.count(otherClient, "SELECT count(DISTINCT transfer_sub) FROM transfer_imports") == computed)

        // Three more users revoke the app: prepared, but Apple refuses to exchange them.
        for index in Self.revokedAfter { try await Self.revoke(Self.sub(index), at: standIn) }
        let moved = computed - Self.revokedAfter.count

        // Exchange, both ways at once (independent databases, half the rate each so that together
        // they keep to the stand-in's limit): on the receiving team's own database, each user
        // created under their new sub; and in place (the whole database moved with the app), the
        // recipient's credentials on the sending database re-keying each account. Each is killed
        // once `killAt` users are done, then rerun.
        let exchange = ["transfers", "exchange", "--from", StandInProcess.teamID, "--rate", "500", "--concurrency", "\(Self.concurrency)"]
        let preparedCalls = try await Self.calls(client)
        started = clock.now
        async let creatingRun = Self.killAndRerun(exchange, environment: receiving, directory: directory) {
            try await Self.count(otherClient, "SELECT count(*) FROM transfer_imports WHERE new_sub IS NOT NULL")
        }
        async let rekeyingRun = Self.killAndRerun(exchange, environment: recipient, directory: directory) {
            try await Self.count(client, "SELECT count(*) FROM account_sub_changes")
        }
        let (creating, rekeying) = try await (creatingRun, rekeyingRun)
        timings.append(("exchange, own database (killed at \(creating.progress), rerun)", creating.duration))
        timings.append(("exchange in place (killed at \(rekeying.progress), rerun)", rekeying.duration))
        timings.append(("both exchanges, concurrently", clock.now - started))

        #expect(creating.killed, "exchange finished before it could be killed: \(creating.output)")
        let created = creating.rerun
        #expect(created.status == 0, "\(created.stdout) \(created.stderr)")
        #expect(created.stdout.contains("\(moved) of \(computed) transfer_subs exchanged (0 accounts re-keyed)"), "\(created.stdout)")
        #expect(created.stdout.contains("\(Self.revokedAfter.count) refused by Apple: invalid_request"), "\(created.stdout)")
        #expect(try await Self.count(otherClient, "SELECT count(*) FROM accounts") == moved)
        #expect(try await Self.count(otherClient, "SELECT count(*) FROM accounts a JOIN transfer_imports i ON i.new_sub = a.sub") == moved)
        #expect(try await Self.count(otherClient, "SELECT count(*) FROM transfer_imports WHERE attempts <> 1") == 0, "a transfer_sub asked twice, or not at all")
        let exchangedThere = try await Self.calls(otherClient)
        #expect((computed...computed + Self.concurrency).contains(exchangedThere.answered) && exchangedThere.tooMany == 0, "\(exchangedThere)")

        #expect(rekeying.killed, "exchange finished before it could be killed: \(rekeying.output)")
        let rekeyed = rekeying.rerun
        #expect(rekeyed.status == 0, "\(rekeyed.stdout) \(rekeyed.stderr)")
        #expect(rekeyed.stdout.contains("\(moved) of \(computed) transfer_subs exchanged (\(moved) accounts re-keyed)"), "\(rekeyed.stdout)")
        #expect(rekeyed.stdout.contains("\(Self.revokedAfter.count) refused by Apple: invalid_request"), "\(rekeyed.stdout)")
        let allCalls = try await Self.calls(client)
        let exchangedHere = (answered: allCalls.answered - preparedCalls.answered, tooMany: allCalls.tooMany - preparedCalls.tooMany)
        #expect((computed...computed + Self.concurrency).contains(exchangedHere.answered) && exchangedHere.tooMany == 0, "\(exchangedHere)")
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_imports WHERE attempts <> 1") == 0, "a transfer_sub asked twice, or not at all")

        // One change per migrated user, from their sub to a new one; nothing left under the old
        // subs; each user's sessions, history and queued jobs counted under the new sub as they
        // were under the old; nothing added, nothing lost; the refused untouched.
        #expect(try await Self.count(client, "SELECT count(*) FROM account_sub_changes") == moved)
        #expect(try await Self.count(client, "SELECT count(DISTINCT new_sub) FROM account_sub_changes") == moved)
        #expect(try await Self.count(client, "SELECT count(*) FROM account_sub_changes c JOIN scale_before b ON b.sub = c.old_sub") == moved)
        for table in ["accounts", "sessions", "notifications", "jobs"] {
            #expect(
                try await Self.count(client, "SELECT count(*) FROM \(table) t JOIN account_sub_changes c ON c.aud = t.aud AND c.old_sub = t.sub") == 0,
                "\(table) rows left under an old sub")
        }
        let mismatched = try await Self.count(
            client,
            """
            SELECT count(*) FROM account_sub_changes c JOIN scale_before b ON b.sub = c.old_sub
            WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.aud = c.aud AND a.sub = c.new_sub AND a.email = b.email)
               OR (SELECT count(*) FROM sessions s WHERE s.aud = c.aud AND s.sub = c.new_sub) <> b.sessions
               OR (SELECT count(*) FROM sessions s WHERE s.aud = c.aud AND s.sub = c.new_sub AND s.revoked_at IS NOT NULL) <> b.revoked_sessions
               OR (SELECT count(*) FROM notifications n WHERE n.aud = c.aud AND n.sub = c.new_sub) <> b.notifications
               OR (SELECT count(*) FROM jobs j WHERE j.aud = c.aud AND j.sub = c.new_sub) <> b.jobs
            """)
        #expect(mismatched == 0, "users whose rows under the new sub differ from those under the old")
        #expect(try await Self.totals(client) == totals)
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE aud = '\(Self.aud)'") == Self.users)
        let untouched = (Self.revokedBefore + Self.revokedAfter).map(Self.sub)
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE sub IN ('\(untouched.joined(separator: "','"))')") == untouched.count)
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE aud = 'com.example.other'") == 1)
        // Both ways give each user the same new sub.
        let here = try await Self.strings(client, "SELECT new_sub FROM account_sub_changes ORDER BY new_sub")
        let there = try await Self.strings(otherClient, "SELECT sub FROM accounts ORDER BY sub")
        #expect(here == there)

        standIn.process.signal(SIGTERM)
        _ = await standIn.process.waitForExit()
        print("transfer of \(Self.users) users:\n" + timings.map { "  \($0.0): \($0.1)" }.joined(separator: "\n") + "\n  whole test: \(clock.now - testStarted)")
    }

    /// The app's users in bulk: each with a session (every third a second one, logged
    /// out), two applied notifications, every tenth a pending one with its queued effect job;
    /// one user of another app; and `scale_before`, each user's counts, to compare after.
    static func load(_ client: PostgresClient) async throws {
        try await client.query(
            """
            INSERT INTO accounts (aud, sub, email, is_private_email)
            SELECT \(aud), lpad(i::text, 6, '0') || '.' || md5('scale' || i) || '.0001', 'u' || i || '@privaterelay.appleid.com', true
            FROM generate_series(1, \(users)) AS i
            """)
        try await client.query("INSERT INTO accounts (aud, sub) VALUES ('com.example.other', '001999.other.0001')")
        try await client.query(
            """
            INSERT INTO sessions (aud, sub, revoked_at, revoked_reason, revoked_by)
            SELECT a.aud, a.sub, CASE WHEN k = 2 THEN now() END, CASE WHEN k = 2 THEN 'logout' END, CASE WHEN k = 2 THEN 'scale' END
            FROM accounts a, generate_series(1, 2) AS k
            WHERE a.aud = \(aud) AND (k = 1 OR split_part(a.sub, '.', 1)::int % 3 = 0)
            """)
        try await client.query(
            """
            INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, email, is_private_email, status, kid, issued_at, raw_jws, header, claims)
            SELECT 'scale-' || k || '-' || a.sub, a.aud, a.sub, t, t, timestamptz '2026-01-01' + k * interval '1 day', a.email, true,
                'applied', 'scale', now(), 'scale', '{}', '{}'
            FROM accounts a, unnest(ARRAY['email-disabled', 'email-enabled']) WITH ORDINALITY AS x(t, k)
            WHERE a.aud = \(aud)
            """)
        try await client.query(
            """
            WITH n AS (
                INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, email, is_private_email, status, kid, issued_at, raw_jws, header, claims)
                SELECT 'scale-pending-' || a.sub, a.aud, a.sub, 'email-disabled', 'email-disabled', timestamptz '2026-02-01', a.email, true,
                    'pending', 'scale', now(), 'scale', '{}', '{}'
                FROM accounts a WHERE a.aud = \(aud) AND split_part(a.sub, '.', 1)::int % 10 = 0
                RETURNING id, aud, sub, event_time, status
            )
            INSERT INTO jobs (notification_id, run_at, aud, sub, event_time) SELECT id, now(), aud, sub, event_time FROM n
            """)
        try await client.query(
            """
            CREATE TABLE scale_before AS
            SELECT a.sub, a.email,
                (SELECT count(*) FROM sessions s WHERE s.aud = a.aud AND s.sub = a.sub) AS sessions,
                (SELECT count(*) FROM sessions s WHERE s.aud = a.aud AND s.sub = a.sub AND s.revoked_at IS NOT NULL) AS revoked_sessions,
                (SELECT count(*) FROM notifications n WHERE n.aud = a.aud AND n.sub = a.sub) AS notifications,
                (SELECT count(*) FROM jobs j WHERE j.aud = a.aud AND j.sub = a.sub) AS jobs
            FROM accounts a WHERE a.aud = \(aud)
            """)
        try await client.query("ANALYZE")
    }

    struct Totals: Equatable {
        var sessions: Int
        var notifications: Int
        var jobs: Int
    }

    static func totals(_ client: PostgresClient) async throws -> Totals {
        Totals(
            sessions: try await count(client, "SELECT count(*) FROM sessions WHERE aud = '\(aud)'"),
            notifications: try await count(client, "SELECT count(*) FROM notifications WHERE aud = '\(aud)'"),
            jobs: try await count(client, "SELECT count(*) FROM jobs WHERE aud = '\(aud)'"))
    }

    /// The calls to `/auth/usermigrationinfo` on record: answered (200 or a refusal) and 429s.
    static func calls(_ client: PostgresClient) async throws -> (answered: Int, tooMany: Int) {
        let answered = try await count(
            client, "SELECT count(*) FROM apple_auth_calls WHERE endpoint = '/auth/usermigrationinfo' AND status IN (200, 400)")
        let tooMany = try await count(client, "SELECT count(*) FROM apple_auth_calls WHERE endpoint = '/auth/usermigrationinfo' AND status = 429")
        return (answered, tooMany)
    }

    /// Marks `sub` as a user who stopped using Sign in with Apple for the app.
    static func revoke(_ sub: String, at standIn: StandInProcess) async throws {
        var mark = HTTPClientRequest(url: "\(standIn.base)/standin/users")
        mark.method = .POST
        mark.headers.add(name: "Content-Type", value: "application/json")
        mark.body = .bytes(ByteBuffer(string: JSONValue.object(["sub": .string(sub), "revoked": .bool(true)]).jsonText))
        #expect(try await HTTPClient.shared.execute(mark, timeout: .seconds(30)).status.code == 200)
    }

    /// A phase killed and rerun: whether it was still running at the kill, its progress then,
    /// its output, the rerun, and the whole time taken.
    struct KilledPhase {
        var killed: Bool
        var progress: Int
        var output: String
        var rerun: TestBinary.Run
        var duration: Duration
    }

    /// Runs the binary with `arguments`, SIGKILLs it once `progress` (read from the database
    /// between waits on the child's exit) reaches `killAt`, then runs it again to its end.
    static func killAndRerun(
        _ arguments: [String], environment: [String: String], directory: String, progress: @escaping @Sendable () async throws -> Int
    ) async throws -> KilledPhase {
        let started = ContinuousClock.now
        let killed = try await killMidway(arguments, environment: environment, directory: directory, progress: progress)
        let rerun = try await TestBinary.run(arguments, environment: environment, directory: directory)
        return KilledPhase(killed: killed.killed, progress: killed.progress, output: killed.output, rerun: rerun, duration: .now - started)
    }

    /// Runs the binary with `arguments` and SIGKILLs it once `progress` (read from the database
    /// between waits on the child's exit) reaches `killAt`; whether it was still running then.
    static func killMidway(
        _ arguments: [String], environment: [String: String], directory: String, progress: () async throws -> Int
    ) async throws -> (killed: Bool, progress: Int, output: String) {
        let (child, output) = try ChildOutput.start(
            TestBinary.url.path, arguments, environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, workingDirectory: directory)
        let end = try ProcessEnd(pid: child.pid)
        let deadline = ContinuousClock.now + .seconds(120)
        var done = try await progress()
        while done < killAt, ContinuousClock.now < deadline {
            if await end.exited(within: .milliseconds(20)) { break }
            done = try await progress()
        }
        child.signal(SIGKILL)
        let status = await child.waitForExit()
        _ = await output.waitForEnd()
        return (status & 0x7f == SIGKILL, try await progress(), output.text)
    }

    static func count(_ client: PostgresClient, _ sql: String) async throws -> Int {
        for try await (n,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((Int,).self) { return n }
        return 0
    }

    static func strings(_ client: PostgresClient, _ sql: String) async throws -> [String] {
        var values: [String] = []
        for try await (value,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((String,).self) { values.append(value) }
        return values
    }
}
