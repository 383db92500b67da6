import Foundation
import PostgresNIO
import SiwaEmbeddedPostgres
import SiwaTestSupport
import Testing

/// deploy/postgres/create-service-role.sh, as the compose file's postgres image runs it: the role
/// it makes owns its database, is no superuser, migrates it and passes `doctor`'s database check.
@Suite("deploy/postgres/create-service-role.sh", .timeLimit(.minutes(10)))
struct PostgresRoleScriptTests {
    /// The test cluster as the script sees it: its superuser URL, the socket directory and the
    /// binaries' folder (the script runs psql from PATH).
    static func cluster() async throws -> (superuserURL: String, components: URLComponents, socket: String, bin: String) {
        let superuserURL = try await TestBinary.databaseURL()
        let components = try #require(URLComponents(string: superuserURL))
        let socket = try #require(components.queryItems?.first { $0.name == "host" }?.value)
        let bin = try #require(["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin"].first {
            FileManager.default.isExecutableFile(atPath: "\($0)/psql")
        })
        return (superuserURL, components, socket, bin)
    }

    @Test("makes a non-superuser role owning its database, which PUBLIC cannot even connect to; siwa-events migrates it and doctor passes")
    func createsServiceRole() async throws {
        let directory = try TestBinary.makeDirectory("role-script")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = try await Self.cluster()
        let (superuserURL, components, socket, bin) = (cluster.superuserURL, cluster.components, cluster.socket, cluster.bin)
        let suffix = UUID().uuidString.prefix(6).lowercased()
        let (role, database) = ("siwa_role_\(suffix)", "siwa_db_\(suffix)")
        try "pw-\(suffix)\n".write(toFile: "\(directory)/password", atomically: true, encoding: .utf8)
        let script = SettingsTests.packageRoot.appendingPathComponent("deploy/postgres/create-service-role.sh").path
        let environment = ProcessInfo.processInfo.environment.merging([
            "PATH": "\(bin):/usr/bin:/bin", "PGHOST": socket, "PGUSER": components.user ?? "", "PGDATABASE": "postgres",
            "SIWA_DB_PASSWORD_FILE": "\(directory)/password", "SIWA_DB_ROLE": role, "SIWA_DB_NAME": database,
        ]) { $1 }
        let run = try await Subprocess.run("/bin/sh", [script], environment: environment)
        #expect(run.succeeded, "\(run.combinedOutput)")

        try await TestBinary.withDatabase(superuserURL) { client in
            for try await (superuser, owner, publicConnect) in try await client.query(
                """
                SELECT r.rolsuper, pg_get_userbyid(d.datdba)::text, has_database_privilege('public', d.oid, 'CONNECT') OR has_database_privilege('public', d.oid, 'TEMPORARY')
                FROM pg_roles r, pg_database d WHERE r.rolname = \(role) AND d.datname = \(database)
                """
            ).decode((Bool, String, Bool).self) {
                #expect(!superuser && owner == role && !publicConnect)
            }
        }
        var service = components
        service.user = role
        service.path = "/\(database)"
        let url = try #require(service.string)
        let migrate = try await TestBinary.run(["migrate"], environment: ["DATABASE_URL": url], directory: directory)
        #expect(migrate.status == 0, "\(migrate.stderr)")
        let nothing = TestBinary.RefusingPort()  // doctor's URL: nothing listens there
        let doctor = try await TestBinary.run(
            ["doctor", "--url", "http://127.0.0.1:\(nothing.port)/apple/notifications", "--timeout", "2s"],
            environment: ["DATABASE_URL": url], directory: directory)
        #expect(doctor.stdout.contains("ok    database:") && doctor.stdout.contains("connected as \(role), not a superuser"), "\(doctor.stdout)")
        withExtendedLifetime(nothing) {}
        // A backend role granted by siwa-events gets CONNECT of its own (PUBLIC has none here).
        try await TestBinary.withDatabase(superuserURL) { client in try await client.query(PostgresQuery(unsafeSQL: "CREATE ROLE backend_\(suffix) LOGIN")) }
        let granted = try await TestBinary.run(["db", "grant-backend", "--role", "backend_\(suffix)"], environment: ["DATABASE_URL": url], directory: directory)
        #expect(granted.status == 0 && granted.stdout.contains("PUBLIC holds neither"), "\(granted.stdout) \(granted.stderr)")
    }

    @Test("the password reaches psql only through its file, never any argv, and is set exactly as written, quotes and all")
    func passwordStaysOffCommandLines() async throws {
        let directory = try TestBinary.makeDirectory("role-argv")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = try await Self.cluster()
        let (superuserURL, components, socket, bin) = (cluster.superuserURL, cluster.components, cluster.socket, cluster.bin)
        let suffix = UUID().uuidString.prefix(6).lowercased()
        let (role, database) = ("siwa_role_\(suffix)", "siwa_db_\(suffix)")
        let password = #"pw-'"\ $HOME `x` :'q' "# + suffix
        try "\(password)\n".write(toFile: "\(directory)/password", atomically: true, encoding: .utf8)
        // A psql earlier on PATH that writes down its arguments, one file per run, then is the real one.
        try FileManager.default.createDirectory(atPath: "\(directory)/wrap", withIntermediateDirectories: true)
        try """
            #!/bin/sh
            log=$(mktemp "\(directory)/argv.XXXXXX")
            for argument in "$0" "$@"; do printf '%s\\0' "$argument" >> "$log"; done
            exec \(bin)/psql "$@"

            """.write(toFile: "\(directory)/wrap/psql", atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: "\(directory)/wrap/psql")
        let script = SettingsTests.packageRoot.appendingPathComponent("deploy/postgres/create-service-role.sh").path
        let environment = ProcessInfo.processInfo.environment.merging([
            "PATH": "\(directory)/wrap:\(bin):/usr/bin:/bin", "PGHOST": socket, "PGUSER": components.user ?? "", "PGDATABASE": "postgres",
            // md5 verifiers can be checked in SQL (a SCRAM one cannot): `md5` || md5(password || role).
            "PGOPTIONS": "-c password_encryption=md5",
            "SIWA_DB_PASSWORD_FILE": "\(directory)/password", "SIWA_DB_ROLE": role, "SIWA_DB_NAME": database,
        ]) { $1 }
        let run = try await Subprocess.run("/bin/sh", [script], environment: environment)
        #expect(run.succeeded, "\(run.combinedOutput)")

        let logs = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasPrefix("argv.") }
        #expect(!logs.isEmpty, "the wrapper recorded no psql run")
        for log in logs {
            let argv = try String(contentsOfFile: "\(directory)/\(log)", encoding: .utf8).split(separator: "\0").map(String.init)
            #expect(!argv.contains { $0.contains(password) }, "the password is in psql's argv: \(argv)")
        }
        try await TestBinary.withDatabase(superuserURL) { client in
            let matches = try await TestBinary.count(
                client, "SELECT count(*)::int FROM pg_authid WHERE rolname = \(role) AND rolpassword = 'md5' || md5(\(password) || rolname)")
            #expect(matches == 1, "the role's password is not the file's")
        }
    }
}
