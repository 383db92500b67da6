import Foundation
import Logging
import PostgresNIO
import SiwaStore
import SiwaTestSupport
import Testing

/// What a role granted by `db grant-backend` can make the database do as the service's owner role.
/// The owner here is a superuser, as it was in the embedded cluster and compose file before
/// sql/015: the worst case, where code run as the owner reads every table and runs programs.
@Suite("SECURITY DEFINER: the backend role never runs code as the owner", .timeLimit(.minutes(10)))
struct SecurityDefinerTests {
    static let logger = Logger(label: "definer-test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// Every SECURITY DEFINER function the migrations make, and how the backend role reaches it.
    /// A new one must be added here with an attack through it, or the audit test fails.
    static let reachable: [String: String] = [
        "siwa_session_allowed()":
            "INSERT INTO public.sessions (aud, sub, expires_at, identity_issued_at) VALUES ('com.example.app', 'attacker', now() + interval '1 day', now())"
    ]

    @Test("every SECURITY DEFINER function is known to this suite and pins search_path with pg_temp last")
    func audit() async throws {
        let database = try await TestCluster.shared.makeDatabase()
        try await Self.withClient(database) { owner in
            var found: [String: [String]] = [:]
            let rows = try await owner.query(
                """
                SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}') FROM pg_proc p
                WHERE p.prosecdef AND p.pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
                """, logger: Self.logger)
            for try await (name, config) in rows.decode((String, [String]).self) { found[name] = config }
            #expect(Set(found.keys) == Set(Self.reachable.keys), "add an attack through each new SECURITY DEFINER function")
            for (name, config) in found {
                #expect(config.contains("search_path=pg_catalog, public, pg_temp"), "\(name): \(config)")
            }
        }
    }

    @Test("shadow tables, functions and operators in pg_temp and public: none runs as the owner, nothing outside sessions changes (and the same attack on sql/011's function does run)")
    func shadowObjectsNeverRun() async throws {
        // Before sql/015 the attack works: the test can tell.
        let before = try await TestCluster.shared.makeEmptyDatabase()
        _ = try await Self.withClient(before) { owner in
            try await Migrator(client: owner, migrations: Migration.all.filter { $0.version < 15 }, logger: Self.logger).migrate()
        }
        let old = try await attack(before)
        #expect(old.ran.contains(old.owner), "the shadow accounts table's trigger ran as the owner before sql/015: \(old.ran)")
        #expect(old.auditRows > 0)

        let database = try await TestCluster.shared.makeDatabase()
        let now = try await attack(database)
        #expect(now.ran.isEmpty, "code planted by the backend role ran as \(now.ran)")
        #expect(now.auditRows == 0)
        #expect(now.changed.isEmpty, "changed outside sessions: \(now.changed)")
        #expect(now.sessionCreated, "the session SQL still works for the role")
    }

    struct Outcome {
        /// The role that owns the database (and so the definer function).
        var owner: String
        /// `current_user` of each run of planted code.
        var ran: [String]
        var auditRows: Int
        /// Tables (other than sessions and the attacker's own account row) whose contents changed.
        var changed: [String]
        var sessionCreated: Bool
    }

    /// As a role made by `db grant-backend` (plus CREATE on public, PostgreSQL 14's default),
    /// plants shadows of every name the definer function uses, then runs the guide's session SQL.
    func attack(_ database: PostgresClient.Configuration) async throws -> Outcome {
        let role = "backend_\(UUID().uuidString.prefix(8).lowercased())"
        return try await Self.withClient(database) { owner in
            try await owner.query(PostgresQuery(unsafeSQL: "CREATE ROLE \(role) LOGIN"), logger: Self.logger)
            _ = try await BackendGrants(client: owner, logger: Self.logger).grant(role: role)
            try await owner.query(PostgresQuery(unsafeSQL: "GRANT CREATE ON SCHEMA public TO \(role)"), logger: Self.logger)
            let snapshotBefore = try await Self.snapshot(owner)
            var ownerName = ""
            for try await (name,) in try await owner.query("SELECT current_user::text", logger: Self.logger).decode((String,).self) { ownerName = name }

            var configuration = database
            configuration.username = role
            return try await Self.withClient(configuration) { backend in
                // Temporary objects belong to one session: everything happens on one connection.
                try await backend.withConnection { c in
                    var schemas: [String] = ["pg_temp"]
                    for try await (schema,) in try await c.query(
                        "SELECT nspname FROM pg_namespace WHERE has_schema_privilege(current_user, oid, 'CREATE') AND nspname NOT LIKE 'pg_temp%'",
                        logger: Self.logger
                    ).decode((String,).self) {
                        schemas.append(schema)
                    }
                    #expect(schemas.contains("public"))
                    let plant = [
                        "CREATE TEMP TABLE ran (who text)",
                        "GRANT ALL ON pg_temp.ran TO PUBLIC",
                        // Records who ran it, then tries what the owner could do: write the audit log.
                        """
                        CREATE FUNCTION pg_temp.record() RETURNS void LANGUAGE plpgsql AS $$ BEGIN
                            INSERT INTO pg_temp.ran VALUES (current_user);
                            BEGIN
                                INSERT INTO public.audit_log (actor, action, target) VALUES ('attacker', 'token.create', current_user);
                            EXCEPTION WHEN insufficient_privilege THEN NULL;
                            END;
                        END $$
                        """,
                        "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN NEW; END $$",
                        "CREATE TEMP TABLE accounts (LIKE public.accounts INCLUDING DEFAULTS)",
                        "ALTER TABLE pg_temp.accounts ADD PRIMARY KEY (aud, sub)",
                        "CREATE TRIGGER evil BEFORE INSERT OR UPDATE ON pg_temp.accounts FOR EACH ROW EXECUTE FUNCTION pg_temp.evil()",
                        "CREATE TEMP TABLE sessions (LIKE public.sessions INCLUDING DEFAULTS)",
                        "CREATE TRIGGER evil BEFORE INSERT OR UPDATE ON pg_temp.sessions FOR EACH ROW EXECUTE FUNCTION pg_temp.evil()",
                    ]
                    for statement in plant { try await c.query(PostgresQuery(unsafeSQL: statement), logger: Self.logger) }
                    // Functions and operators the definer names, in every schema the role can create in.
                    for schema in schemas {
                        let shadows = [
                            "CREATE FUNCTION \(schema).now() RETURNS timestamptz LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN pg_catalog.now(); END $$",
                            "CREATE FUNCTION \(schema).to_char(timestamp, text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN 'x'; END $$",
                            "CREATE FUNCTION \(schema).timezone(text, timestamptz) RETURNS timestamp LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN pg_catalog.timezone($1, $2); END $$",
                            "CREATE FUNCTION \(schema).eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN $1 OPERATOR(pg_catalog.=) $2; END $$",
                            "CREATE OPERATOR \(schema).= (LEFTARG = text, RIGHTARG = text, FUNCTION = \(schema).eq)",
                            "CREATE FUNCTION \(schema).ge(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_temp.record(); RETURN $1 OPERATOR(pg_catalog.>=) $2; END $$",
                            "CREATE OPERATOR \(schema).>= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = \(schema).ge)",
                            "CREATE OPERATOR \(schema).<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = \(schema).ge)",
                        ]
                        for statement in shadows { try await c.query(PostgresQuery(unsafeSQL: statement), logger: Self.logger) }
                    }
                    // The user revoked consent earlier, so the consent branch (its UPDATE) runs too.
                    try await owner.query(
                        "INSERT INTO accounts (aud, sub, consent_revoked_at) VALUES ('com.example.app', 'attacker', now() - interval '1 hour')",
                        logger: Self.logger)

                    var created = false
                    for attack in Self.reachable.values {
                        do {
                            try await c.query(PostgresQuery(unsafeSQL: attack), logger: Self.logger)
                            created = true
                        } catch {
                            Issue.record("the session SQL failed for the backend role: \(String(reflecting: error))")
                        }
                    }
                    var ran: [String] = []
                    for try await (who,) in try await c.query("SELECT who FROM pg_temp.ran", logger: Self.logger).decode((String,).self) {
                        ran.append(who)
                    }
                    var audit = 0
                    for try await (n,) in try await owner.query("SELECT count(*)::int FROM public.audit_log WHERE actor = 'attacker'", logger: Self.logger)
                        .decode((Int,).self)
                    {
                        audit = n
                    }
                    let snapshotAfter = try await Self.snapshot(owner)
                    let changed = snapshotAfter.keys.filter { snapshotBefore[$0] != snapshotAfter[$0] }.sorted()
                    return Outcome(owner: ownerName, ran: ran, auditRows: audit, changed: changed, sessionCreated: created)
                }
            }
        }
    }

    /// A digest of every table but sessions (and the attacker's account row, which the trigger
    /// creates), plus the objects in public not owned by the attacker.
    static func snapshot(_ client: PostgresClient) async throws -> [String: String] {
        var tables: [String] = []
        for try await (name,) in try await client.query(
            "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> 'sessions'",
            logger: logger
        ).decode((String,).self) {
            tables.append(name)
        }
        var digest: [String: String] = [:]
        for table in tables {
            let filter = table == "accounts" ? "WHERE sub <> 'attacker'" : ""
            for try await (hash,) in try await client.query(
                PostgresQuery(unsafeSQL: "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM public.\(table) t \(filter)"),
                logger: logger
            ).decode((String,).self) {
                digest[table] = hash
            }
        }
        for try await (count,) in try await client.query(
            """
            SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND pg_get_userbyid(relowner) NOT LIKE 'backend_%')
                 + (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND pg_get_userbyid(proowner) NOT LIKE 'backend_%')
            """, logger: logger
        ).decode((Int,).self) {
            digest["objects in public"] = "\(count)"
        }
        return digest
    }

    static func withClient<T: Sendable>(_ configuration: PostgresClient.Configuration, _ body: (PostgresClient) async throws -> T) async throws -> T {
        let client = PostgresClient(configuration: configuration)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client)
        }
    }
}
