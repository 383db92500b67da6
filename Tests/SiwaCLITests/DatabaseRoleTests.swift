import Foundation
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// The role the service connects as: a superuser is warned about by `serve` and fails `doctor`;
/// a role that owns the database and is no superuser passes.
@Suite("The service's database role", .timeLimit(.minutes(10)))
struct DatabaseRoleTests {
    @Test("serve warns and doctor fails when DATABASE_URL is a superuser; a non-superuser owner passes both quietly")
    func superuserIsFlagged() async throws {
        let directory = try TestBinary.makeDirectory("role")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let superuserURL = try await TestBinary.databaseURL()  // the test cluster's bootstrap superuser
        let components = try #require(URLComponents(string: superuserURL))
        let database = String(components.path.dropFirst())
        let role = "siwa_owner_\(UUID().uuidString.prefix(6).lowercased())"
        try await TestBinary.withDatabase(superuserURL) { client in
            try await client.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN"))
            try await client.query(PostgresQuery(unsafeSQL: "ALTER DATABASE \(database) OWNER TO \(role)"))
            try await client.query(PostgresQuery(unsafeSQL: EmbeddedPostgres.handOverObjects(from: EmbeddedPostgres.superuser, to: role)))
        }
        var owned = components
        owned.user = role
        let ownerURL = try #require(owned.string)

        let nothing = TestBinary.RefusingPort()  // doctor's URL: nothing listens there
        for (url, superuser) in [(superuserURL, true), (ownerURL, false)] {
            // The warning comes after the migrations and before the listener.
            let serving = try await TestBinary.startServing(
                environment: ["DATABASE_URL": url, "SIWA_APPLE_BUNDLE_IDS": "com.example.role", "SIWA_APPLE_JWKS_URL": "file:///nonexistent/jwks.json"],
                directory: directory, ready: false)
            let (server, output) = (serving.process, serving.output)
            server.signal(SIGTERM)
            #expect(await server.waitForExit() == 0)
            #expect(output.text.contains("a superuser") == superuser, "\(superuser): \(output.text)")

            let doctor = try await TestBinary.run(
                ["doctor", "--url", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--timeout", "2s"],
                environment: ["DATABASE_URL": url], directory: directory)
            if superuser {
                #expect(doctor.stdout.contains("FAIL  database:") && doctor.stdout.contains("a superuser"), "\(doctor.stdout)")
            } else {
                #expect(doctor.stdout.contains("ok    database:") && doctor.stdout.contains("connected as \(role), not a superuser"), "\(doctor.stdout)")
                #expect(doctor.stdout.contains("ok    apple-revocations: 0 revocations of kept Apple tokens waiting, none discarded"), "\(doctor.stdout)")
            }
        }
        // A revocation out of attempts holds a token Apple never took: doctor says so, and what to run.
        try await TestBinary.withDatabase(superuserURL) { client in
            try await client.query(
                """
                INSERT INTO jobs (lane, kind, aud, sub, target, payload, state, finished_at)
                VALUES ('apple_revocations', 'refresh_token', 'com.example.role', 'gone', 'com.example.role', 'v1.00000000.AAAA', 'discarded', now()),
                       ('apple_revocations', 'refresh_token', 'com.example.role', 'going', 'com.example.role', 'v1.00000000.AAAA', 'retryable', NULL)
                """)
        }
        let stuck = try await TestBinary.run(
            ["doctor", "--url", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--timeout", "2s"], environment: ["DATABASE_URL": ownerURL],
            directory: directory)
        #expect(
            stuck.stdout.contains("warn  apple-revocations: 1 revocation of kept Apple tokens waiting, 1 discarded after their last attempt")
                && stuck.stdout.contains("apple retry --discarded"), "\(stuck.stdout)")
        // Nothing to check where there is no database: said, not failed.
        let nowhere = try await TestBinary.run(
            ["doctor", "--url", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--timeout", "2s"],
            directory: directory)
        #expect(nowhere.stdout.contains("warn  database: not checked"), "\(nowhere.stdout)")
        withExtendedLifetime(nothing) {}
    }
}
