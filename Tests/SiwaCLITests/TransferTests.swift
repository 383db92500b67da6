import AsyncHTTPClient
import Crypto
import NIOCore
import NIOHTTP1
import Foundation
import PostgresNIO
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The sending side of an app transfer through the real binary, against `standin serve` with a
/// recipient team: `transfers prepare` (resumable, rate-limited, per-user refusals kept) and
/// `transfers export` (transfer_subs only).
@Suite("Transfers: the sending side", .timeLimit(.minutes(10)))
struct TransferTests {
    static let recipient = "TEAMB23456"

    @Test("prepare asks for every user's transfer_sub once: stopped by Apple it resumes, it waits out Apple's 429s, a revoked user is kept as refused; export holds transfer_subs only")
    func prepareAndExport() async throws {
        let directory = try TestBinary.makeDirectory("transfers")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let standIn = try await StandInProcess.start(
            in: directory, arguments: ["--recipient-team-id", Self.recipient, "--recipient-key-id", "KEYB234567", "--migration-rate", "5"])
        defer { standIn.process.signal(SIGKILL) }

        let database = try await TestCluster.shared.makeDatabase()
        let socketDirectory = ((database.unixSocketPath ?? "") as NSString).deletingLastPathComponent
        let databaseURL = "postgres://\(database.username)@/\(database.database ?? "")?host=\(socketDirectory)"
        #expect(try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": databaseURL], directory: directory).status == 0)
        let client = PostgresClient(configuration: database)
        let running = Task { await client.run() }
        defer { running.cancel() }
        let subs = (0..<30).map { String(format: "001%03d.%@.0001", $0, UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()) }
        for sub in subs {
            try await client.query("INSERT INTO accounts (aud, sub, email) VALUES ('com.example.app', \(sub), \("r\(UUID().uuidString.prefix(8).lowercased())@privaterelay.appleid.com"))")
        }
        try await client.query("INSERT INTO accounts (aud, sub) VALUES ('com.example.other', '001999.other.0001')")  // another app: not transferred
        try await client.query("INSERT INTO accounts (aud, sub, erased_at) VALUES ('com.example.app', '001998.erased.0001', now())")  // erased: not handed on
        // One user stopped using Apple ID with the app: Apple refuses their transfer_sub.
        var mark = HTTPClientRequest(url: "\(standIn.base)/standin/users")
        mark.method = .POST
        mark.headers.add(name: "Content-Type", value: "application/json")
        mark.body = .bytes(ByteBuffer(string: JSONValue.object(["sub": .string(subs[7]), "revoked": .bool(true)]).jsonText))
        #expect(try await HTTPClient.shared.execute(mark, timeout: .seconds(30)).status.code == 200)

        let environment = [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BUNDLE_IDS": "com.example.app", "SIWA_APPLE_TEAM_ID": StandInProcess.teamID,
            "SIWA_APPLE_KEY_ID": StandInProcess.keyID, "SIWA_APPLE_PRIVATE_KEY_FILE": StandInProcess.keyFile(in: directory),
            "SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey(), "SIWA_APPLE_AUTH_URL": standIn.base,
        ]
        let own = try await TestBinary.run(["transfers", "prepare", "--target", StandInProcess.teamID], environment: environment, directory: directory)
        #expect(own.status == 64 && own.stderr.contains("is this team (SIWA_APPLE_TEAM_ID)"), "\(own.status) \(own.stderr)")

        // Apple fails the first call: the run stops, saying how to resume, having kept nothing.
        var failure = HTTPClientRequest(url: "\(standIn.base)/standin/failures")
        failure.method = .POST
        failure.headers.add(name: "Content-Type", value: "application/json")
        failure.body = .bytes(ByteBuffer(string: #"{"endpoint": "usermigrationinfo", "status": 503, "count": 1}"#))
        #expect(try await HTTPClient.shared.execute(failure, timeout: .seconds(30)).status.code == 204)
        let stopped = try await TestBinary.run(["transfers", "prepare", "--target", Self.recipient], environment: environment, directory: directory)
        #expect(stopped.status == 1 && stopped.stderr.contains("rerun to resume") && stopped.stderr.contains("30 users left"), "\(stopped.stdout) \(stopped.stderr)")
        #expect(try await Self.computed(client) == 0)

        // Faster than the stand-in's 5 a second: Apple's 429s are waited out, a second at a time.
        let resumed = try await TestBinary.run(
            ["transfers", "prepare", "--target", Self.recipient, "--rate", "1000"], environment: environment, directory: directory)
        #expect(resumed.status == 0, "\(resumed.stdout) \(resumed.stderr)")
        #expect(resumed.stdout.contains("29 of 30 users have a transfer_sub for team \(Self.recipient)"), "\(resumed.stdout)")
        #expect(resumed.stdout.contains("1 refused by Apple: invalid_request"), "\(resumed.stdout)")
        #expect(try await Self.count(client, "SELECT count(*) FROM apple_auth_calls WHERE endpoint = '/auth/usermigrationinfo' AND status = 429") > 0)
        #expect(try await Self.computed(client) == 29)
        #expect(try await Self.count(client, "SELECT count(DISTINCT transfer_sub) FROM transfer_subs") == 29)
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE attempts > 1") == 0, "a user was asked twice")
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE sub IN ('001999.other.0001', '001998.erased.0001')") == 0)

        // Export: the header and one transfer_sub a line; no sub, no address; readable by its owner only.
        let file = "\(directory)/transfer.ndjson"
        let exported = try await TestBinary.run(
            ["transfers", "export", "--target", Self.recipient, "--output", file], environment: environment, directory: directory)
        #expect(exported.status == 0 && exported.stdout.contains("wrote 29 transfer_subs"), "\(exported.stdout) \(exported.stderr)")
        let text = try String(contentsOfFile: file, encoding: .utf8)
        let lines = text.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8)) }
        #expect(lines.count == 30)
        #expect(lines.first?["target"] == .string(Self.recipient) && lines.first?["count"] == .number(29))
        #expect(Set(lines.dropFirst().compactMap { $0["transfer_sub"]?.stringValue }).count == 29)
        for sub in subs { #expect(!text.contains(sub), "the export holds a sub") }
        #expect(!text.contains("privaterelay"))
        let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let status = try await TestBinary.run(["transfers", "status"], environment: ["DATABASE_URL": databaseURL], directory: directory)
        #expect(status.stdout.contains("outgoing com.example.app team \(Self.recipient): 29/30 transfer_subs, refused: 1 invalid_request, 0 pending"), "\(status.stdout)")
        // The transfer's date: the window's days left, or that it closed.
        func day(_ daysAgo: Int) -> String { String(iso8601(Date().addingTimeInterval(-Double(daysAgo) * 86_400)).prefix(10)) }
        let recent = try await TestBinary.run(
            ["transfers", "start", "--target", Self.recipient, "--date", day(10)], environment: environment, directory: directory)
        #expect(recent.status == 0 && recent.stdout.contains("days left to exchange identifiers"), "\(recent.stdout) \(recent.stderr)")
        let old = try await TestBinary.run(
            ["transfers", "start", "--target", Self.recipient, "--date", day(70)], environment: environment, directory: directory)
        #expect(old.stdout.contains("the 60-day window closed"), "\(old.stdout) \(old.stderr)")
        let closed = try await TestBinary.run(["transfers", "status"], environment: ["DATABASE_URL": databaseURL], directory: directory)
        #expect(closed.stdout.contains("29/30 transfer_subs") && closed.stdout.contains("the 60-day window closed"), "\(closed.stdout)")
        let badDate = try await TestBinary.run(
            ["transfers", "start", "--target", Self.recipient, "--date", "20 Nov"], environment: environment, directory: directory)
        #expect(badDate.status == 64 && badDate.stderr.contains("--date must be a day like 2026-11-20"), "\(badDate.stderr)")
        let both = try await TestBinary.run(
            ["transfers", "start", "--target", Self.recipient, "--from", Self.recipient, "--date", day(1)], environment: environment, directory: directory)
        #expect(both.status == 64 && both.stderr.contains("give --target (sending side) or --from (receiving side)"), "\(both.stderr)")

        // Users known since are asked for on the next run; the others are not asked again.
        for index in 30..<33 {
            try await client.query("INSERT INTO accounts (aud, sub) VALUES ('com.example.app', \("001\(index).later.0001"))")
        }
        let later = try await TestBinary.run(["transfers", "prepare", "--target", Self.recipient, "--rate", "4"], environment: environment, directory: directory)
        #expect(later.stdout.contains("32 of 33 users have a transfer_sub"), "\(later.stdout) \(later.stderr)")
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_subs WHERE attempts > 1") == 0, "a user was asked twice")
        // Every call to Apple is on record, none with a user's sub in clear.
        #expect(try await Self.count(client, "SELECT count(*) FROM apple_auth_calls WHERE endpoint = '/auth/usermigrationinfo'") >= 33)
        #expect(try await DatabaseSearch.occurrences(of: subs[3], in: client) == 2)  // accounts.sub and transfer_subs.sub only

        // The receiving side, on this database (it moved with the app): each prepared transfer_sub
        // exchanged with the recipient team's credentials, each account re-keyed with its history.
        for sub in subs {
            try await client.query("INSERT INTO sessions (aud, sub) VALUES ('com.example.app', \(sub))")
            try await client.query(
                """
                WITH n AS (
                    INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, status, kid, issued_at, raw_jws, header, claims)
                    VALUES (\("jti-" + sub), 'com.example.app', \(sub), 'consent-revoked', 'consent-revoked', now(), 'applied', 'k', now(), 'x', '{}', '{}')
                    RETURNING id, aud, sub, event_time)
                INSERT INTO jobs (notification_id, aud, sub, event_time, state, finished_at) SELECT id, aud, sub, event_time, 'completed', now() FROM n
                """)
        }
        // A revocation at Apple still queued for the first user: it stays under the sub its
        // ciphertext is sealed for (TransferErasureTests delivers one).
        try await client.query(
            """
            INSERT INTO jobs (lane, kind, aud, sub, target, payload) VALUES ('apple_revocations', 'refresh_token', 'com.example.app', \(subs[0]),
                'com.example.app', 'ciphertext')
            """)
        mark = HTTPClientRequest(url: "\(standIn.base)/standin/users")
        mark.method = .POST
        mark.headers.add(name: "Content-Type", value: "application/json")
        mark.body = .bytes(ByteBuffer(string: JSONValue.object(["sub": .string(subs[8]), "revoked": .bool(true)]).jsonText))
        #expect(try await HTTPClient.shared.execute(mark, timeout: .seconds(30)).status.code == 200)
        let recipient = environment.merging([
            "SIWA_APPLE_TEAM_ID": Self.recipient, "SIWA_APPLE_KEY_ID": "KEYB234567", "SIWA_APPLE_PRIVATE_KEY_FILE": "\(directory)/keys/AuthKey_KEYB234567.p8",
        ]) { $1 }
        let exchanged = try await TestBinary.run(
            ["transfers", "exchange", "--from", StandInProcess.teamID, "--rate", "1000"], environment: recipient, directory: directory)
        #expect(exchanged.status == 0, "\(exchanged.stdout) \(exchanged.stderr)")
        #expect(exchanged.stdout.contains("31 of 32 transfer_subs exchanged (31 accounts re-keyed)"), "\(exchanged.stdout)")
        // The receiving side's record of the transfer takes the day the sending side recorded.
        #expect(try await Self.count(client, "SELECT count(DISTINCT transferred_at) FROM transfers WHERE client_id = 'com.example.app'") == 1)
        #expect(try await Self.count(client, "SELECT count(*) FROM transfers WHERE client_id = 'com.example.app'") == 2)
        #expect(exchanged.stdout.contains("1 refused by Apple: invalid_request"), "\(exchanged.stdout)")
        let moved = Array(subs[0..<7] + subs[9...])
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE sub = ANY('{\(moved.joined(separator: ","))}')") == 0)
        #expect(try await Self.count(client, "SELECT count(*) FROM account_sub_changes") == 31)
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts a JOIN account_sub_changes c ON c.aud = a.aud AND c.new_sub = a.sub") == 31)
        #expect(try await Self.count(client, "SELECT count(*) FROM sessions s JOIN account_sub_changes c ON c.aud = s.aud AND c.new_sub = s.sub") == 28)
        #expect(try await Self.count(client, "SELECT count(*) FROM notifications n JOIN account_sub_changes c ON c.aud = n.aud AND c.new_sub = n.sub") == 28)
        #expect(try await Self.count(client, "SELECT count(*) FROM jobs j JOIN account_sub_changes c ON c.aud = j.aud AND c.new_sub = j.sub") == 28)
        #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND sub = '\(subs[0])'") == 1)
        // The two users Apple refused (revoked the app) keep their accounts, sessions and history as they were.
        #expect(try await Self.count(client, "SELECT count(*) FROM sessions WHERE sub IN ('\(subs[7])', '\(subs[8])')") == 2)
        #expect(try await Self.count(client, "SELECT count(*) FROM accounts WHERE aud = 'com.example.app' AND erased_at IS NULL") == 33)
        // Run again: nothing left to ask for, nothing moved twice.
        let again = try await TestBinary.run(["transfers", "exchange", "--from", StandInProcess.teamID], environment: recipient, directory: directory)
        #expect(again.stdout.contains("31 of 32 transfer_subs exchanged"), "\(again.stdout) \(again.stderr)")
        #expect(again.stderr.contains("nothing left to exchange"), "\(again.stderr)")
        #expect(try await Self.count(client, "SELECT count(*) FROM transfer_imports WHERE attempts > 1") == 0)
        // The sending side's prepare, run again after the exchange in place: the 31 accounts now under
        // the recipient's subs are the recipient's users, not new ones of ours; Apple is not asked.
        let calls = try await Self.count(client, "SELECT count(*) FROM apple_auth_calls")
        let rerun = try await TestBinary.run(["transfers", "prepare", "--target", Self.recipient], environment: environment, directory: directory)
        #expect(rerun.status == 0 && rerun.stderr.contains("33 users (0 new), 0 to ask for"), "\(rerun.stdout) \(rerun.stderr)")
        #expect(rerun.stdout.contains("32 of 33 users have a transfer_sub"), "\(rerun.stdout)")
        #expect(try await Self.count(client, "SELECT count(*) FROM apple_auth_calls") == calls)

        // The receiving side on a database of its own: the export imported, each user created under their new sub.
        let other = try await TestCluster.shared.makeDatabase()
        let otherURL = "postgres://\(other.username)@/\(other.database ?? "")?host=\(socketDirectory)"
        #expect(try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": otherURL], directory: directory).status == 0)
        var receiving = recipient
        receiving["DATABASE_URL"] = otherURL
        let imported = try await TestBinary.run(["transfers", "import", file, "--from", StandInProcess.teamID], environment: receiving, directory: directory)
        #expect(imported.status == 0 && imported.stdout.contains("imported 29 transfer_subs"), "\(imported.stdout) \(imported.stderr)")
        let created = try await TestBinary.run(
            ["transfers", "exchange", "--from", StandInProcess.teamID, "--rate", "1000"], environment: receiving, directory: directory)
        #expect(created.stdout.contains("28 of 29 transfer_subs exchanged (0 accounts re-keyed)"), "\(created.stdout) \(created.stderr)")
        let otherClient = PostgresClient(configuration: other)
        let otherRunning = Task { await otherClient.run() }
        defer { otherRunning.cancel() }
        #expect(try await Self.count(otherClient, "SELECT count(*) FROM accounts") == 28)
        let bad = try await TestBinary.run(["transfers", "import", "\(directory)/missing.ndjson", "--from", StandInProcess.teamID], environment: receiving, directory: directory)
        #expect(bad.status != 0 && bad.stderr.contains("cannot read"), "\(bad.stderr)")

        standIn.process.signal(SIGTERM)
        _ = await standIn.process.waitForExit()
    }

    @Test("import prints another team's file's strings escaped and cut: no escape sequence from the file reaches the terminal")
    func importEscapesFileText() async throws {
        let directory = try TestBinary.makeDirectory("transfers-escape")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let hostile = "com.example.\u{1B}]0;pwned\u{07}\u{1B}[2J\u{9B}31m" + String(repeating: "A", count: 5000)
        let header = JSONValue.object(["client_id": .string(hostile), "target": .string("TEAMB23456"), "count": .number(1)]).jsonText
        try "\(header)\n{\"transfer_sub\": \"x\"}\n".write(toFile: "\(directory)/hostile.ndjson", atomically: true, encoding: .utf8)
        // The file is read (and refused: another client ID) before any database is opened.
        let run = try await TestBinary.run(
            ["transfers", "import", "hostile.ndjson", "--from", StandInProcess.teamID],
            environment: ["SIWA_APPLE_BUNDLE_IDS": "com.example.app", "DATABASE_URL": "postgres://nobody@/nothing?host=/nonexistent"], directory: directory)
        let output = run.stdout + run.stderr
        #expect(run.status != 0 && output.contains("is for client ID com.example."), "\(run.status) \(output)")
        #expect(!output.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\u{07}" || $0 == "\u{9B}" }, "\(output.debugDescription)")
        #expect(output.contains(#"\u{1b}]0;pwned"#) && output.contains("bytes]"), "\(output)")
        #expect(output.utf8.count < 2000, "the 5000-byte client ID is cut: \(output.utf8.count) bytes")
    }

    static func computed(_ client: PostgresClient) async throws -> Int {
        try await count(client, "SELECT count(*) FROM transfer_subs WHERE transfer_sub IS NOT NULL")
    }

    static func count(_ client: PostgresClient, _ sql: String) async throws -> Int {
        for try await (n,) in try await client.query(PostgresQuery(unsafeSQL: sql)).decode((Int,).self) { return n }
        return 0
    }
}
