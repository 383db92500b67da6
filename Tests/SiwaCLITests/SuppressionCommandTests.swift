import Foundation
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaRuntime
import SiwaTestSupport
import Testing

/// `siwa-events suppressions`, the real binary on a real database: the backfill killed mid-way and
/// run again, the snapshot export, the lanes' status, bad input.
@Suite("siwa-events suppressions", .timeLimit(.minutes(10)))
struct SuppressionCommandTests {
    static let app = "com.example.app"

    /// 55 addresses of the app (every third lifted), 3 of another app.
    static func seed(_ client: PostgresClient) async throws {
        try await client.query(
            """
            INSERT INTO suppressions (aud, address, sub, suppressed, reason, event_time)
            SELECT \(app), 'a' || lpad(n::text, 3, '0') || '@privaterelay.appleid.com', 's' || n, n % 3 <> 0,
                CASE WHEN n % 3 <> 0 THEN 'email_disabled' ELSE 'email_enabled' END, timestamptz '2026-11-01' + n * interval '1 minute'
            FROM generate_series(1, 55) n
            UNION ALL
            SELECT 'com.example.other', 'o' || n || '@privaterelay.appleid.com', 'o' || n, true, 'email_disabled', now() FROM generate_series(1, 3) n
            """)
    }

    static func count(_ client: PostgresClient, _ sql: String) async throws -> Int {
        try await TestBinary.count(client, PostgresQuery(unsafeSQL: sql))
    }

    @Test("sync killed mid-way and run again queues every address of the app once, with its current state, and never another app's")
    func syncResumesWithoutDuplicates() async throws {
        let url = try await TestBinary.databaseURL()
        let directory = try TestBinary.makeDirectory("suppressions")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let environment = ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": Self.app]
        try await TestBinary.withDatabase(url) { client in
            try await Self.seed(client)
            // A backlog of 5 holds the run after its first chunk of 10: nothing delivers them.
            let (process, output) = try ChildOutput.start(
                TestBinary.url.path, ["suppressions", "sync", "--target", "postmark", "--chunk", "10", "--backlog", "5"],
                environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, workingDirectory: directory)
            // Each chunk it queues NOTIFYs siwa_jobs with the lane's name.
            try await DatabaseEvents.count(client, "SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'", reaches: 10, on: "siwa_jobs", within: .seconds(120))
            process.signal(SIGKILL)
            _ = await process.waitForExit()
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'") == 10, "\(output.text)")
            // Delivered meanwhile.
            try await client.query("UPDATE jobs SET state = 'completed', finished_at = now() WHERE lane = 'suppressions_postmark'")

            let resumed = try await TestBinary.run(["suppressions", "sync", "--target", "postmark", "--chunk", "10"], environment: environment, directory: directory, within: .seconds(120))
            #expect(resumed.status == 0, "\(resumed.output)")
            #expect(resumed.output.contains("postmark: 55 addresses queued"), "\(resumed.output)")
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'") == 55)
            #expect(try await Self.count(client, "SELECT count(*) FROM (SELECT target FROM jobs WHERE lane = 'suppressions_postmark' GROUP BY target HAVING count(*) > 1) d") == 0)
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark' AND aud <> 'com.example.app'") == 0)
            #expect(try await Self.count(
                client,
                "SELECT count(*) FROM jobs j JOIN suppressions s ON s.aud = j.aud AND s.address = j.target WHERE j.kind = CASE WHEN s.suppressed THEN 'suppress' ELSE 'lift' END") == 55)

            let again = try await TestBinary.run(["suppressions", "sync", "--target", "postmark"], environment: environment, directory: directory, within: .seconds(120))
            #expect(again.output.contains("the sync finished at") && again.output.contains("--restart"), "\(again.output)")
            #expect(try await Self.count(client, "SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'") == 55)

            let listed = try await TestBinary.run(["suppressions", "list"], environment: environment, directory: directory, within: .seconds(120))
            #expect(listed.status == 0 && listed.output.contains("postmark") && listed.output.contains("45"), "\(listed.output)")  // 55 - 10 completed still pending
        }
    }

    @Test("export writes every address suppressed now: Mailgun's CSV by default, SES's lines with --format ses-csv")
    func export() async throws {
        let url = try await TestBinary.databaseURL()
        let directory = try TestBinary.makeDirectory("suppressions-export")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let environment = ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": Self.app]
        try await TestBinary.withDatabase(url) { client in try await Self.seed(client) }
        let csv = try await TestBinary.run(["suppressions", "export"], environment: environment, directory: directory)
        #expect(csv.status == 0, "\(csv.stderr)")
        let lines = csv.stdout.split(separator: "\n")
        #expect(lines.first == "address,code,error,created_at")
        #expect(lines.count == 1 + 37)  // 55 less the 18 lifted; never the other app's
        #expect(lines.dropFirst().first == "a001@privaterelay.appleid.com,550,email_disabled,\"Sun, 01 Nov 2026 00:01:00 UTC\"")
        let ses = try await TestBinary.run(["suppressions", "export", "--format", "ses-csv"], environment: environment, directory: directory)
        #expect(ses.stdout.split(separator: "\n").first == "a001@privaterelay.appleid.com,BOUNCE")
        let other = try await TestBinary.run(["suppressions", "export", "--aud", "com.example.other"], environment: environment, directory: directory)
        #expect(other.stdout.split(separator: "\n").count == 1 + 3)
    }

    @Test("bad input names the flag and changes nothing")
    func badInput() async throws {
        let url = try await TestBinary.databaseURL()
        let environment = ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": Self.app]
        let badTarget = try await TestBinary.run(["suppressions", "sync", "--target", "mailchimp"], environment: environment, directory: "/tmp")
        #expect(badTarget.status != 0 && badTarget.stderr.contains("--target must be one of postmark, sendgrid, mailgun, resend, ses"), "\(badTarget.stderr)")
        let both = try await TestBinary.run(["suppressions", "retry", "--target", "ses", "7", "--discarded"], environment: environment, directory: "/tmp")
        #expect(both.status != 0 && both.stderr.contains("give an operation id, or --discarded"), "\(both.stderr)")
        let noApps = try await TestBinary.run(["suppressions", "export"], environment: ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": ""], directory: "/tmp")
        #expect(noApps.status != 0 && noApps.stderr.contains("SIWA_APPLE_BUNDLE_IDS"), "\(noApps.stderr)")
        let jobs = try await TestBinary.withDatabase(url) { client in try await Self.count(client, "SELECT count(*) FROM jobs") }
        #expect(jobs == 0)
    }
}
