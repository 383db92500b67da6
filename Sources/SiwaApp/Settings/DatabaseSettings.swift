extension Settings {
    package static let databaseURL = Setting<String?>.optionalText(
        "DATABASE_URL", flag: "database-url", .database, shown: "embedded cluster",
        help: "PostgreSQL URL; without it the embedded cluster under SIWA_DATA_DIR is used",
        docs: "`postgres://user:password@host:5432/db?sslmode=disable\\|prefer\\|require`, or `postgres://user@/db?host=/run/postgresql` for a unix socket. Several hosts, tried in order as libpq does: `postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write` (`any`, the default; `read-write`; `primary`); see operations.md, \"HA / failover\".",
        secret: true)
    package static let embeddedDatabase = Setting<Bool>.boolean(
        "SIWA_EMBEDDED_DATABASE", flag: "embedded-database", .database, default: true, shownAs: ("on", "off"),
        help: "on|off: may a missing DATABASE_URL start the embedded cluster",
        docs: "`off` turns a missing `DATABASE_URL` into a start-up error (deployments: never \"each replica has its own database\").")
    package static let dataDirectory = Setting<String>.text(
        "SIWA_DATA_DIR", flag: "data-dir", .database, default: "./.siwa",
        help: "where the embedded PostgreSQL keeps its data",
        docs: "Where the embedded cluster keeps its data.")
    package static let postgresBinaries = Setting<String?>.optionalText(
        "SIWA_POSTGRES_BIN", flag: "postgres-bin", .database, shown: "newest `/usr/lib/postgresql/*/bin`",
        help: "PostgreSQL server binaries for the embedded cluster (else initdb on PATH)",
        docs: "PostgreSQL server binaries for the embedded cluster.")
    package static let databasePoolSize = Setting<Int>.integer(
        "SIWA_DATABASE_POOL_SIZE", flag: "database-pool-size", .database, default: 32, 1...1000,
        help: "maximum PostgreSQL connections",
        docs: "PostgreSQL connections of a `serve` process at most (opened as load needs them, closed after 5 s unused); 8-16 is plenty per role.")
    package static let databaseTimeout = Setting<Duration>.duration(
        "SIWA_DATABASE_TIMEOUT", flag: "database-timeout", .database, default: .seconds(5),
        help: "longest wait for the database before answering 503",
        docs: "Longest wait for the database before answering 503.")
    package static let migrateOnStart = Setting<Bool>.boolean(
        "SIWA_MIGRATE_ON_START", flag: "migrate-on-start", .database, default: true, shownAs: ("true", "false"),
        help: "true|false: apply pending migrations when serving",
        docs: "Apply pending migrations on `serve`; with `false`, `serve` refuses to start while the schema is behind and says to run `siwa-events migrate`.")

    static let database = [
        databaseURL.info, embeddedDatabase.info, dataDirectory.info, postgresBinaries.info, databasePoolSize.info, databaseTimeout.info, migrateOnStart.info,
    ]
}

/// What `Database.open` connects to: `DATABASE_URL`, or the embedded cluster, and the pool.
package struct DatabaseSettings: Sendable {
    package var url: String?
    package var embedded: Bool
    package var dataDirectory: String
    /// The embedded cluster's PostgreSQL binaries (nil: the newest installed).
    package var postgresBinaries: String?
    package var poolSize: Int
    /// The longest wait for the database before answering 503.
    package var timeout: Duration
    package var migrateOnStart: Bool

    /// No `DATABASE_URL` may start the embedded cluster only with `SIWA_EMBEDDED_DATABASE` on.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        url = try source.value(Settings.databaseURL)
        embedded = try source.value(Settings.embeddedDatabase)
        dataDirectory = try source.value(Settings.dataDirectory)
        postgresBinaries = try source.value(Settings.postgresBinaries)
        poolSize = try source.value(Settings.databasePoolSize)
        timeout = try source.value(Settings.databaseTimeout)
        migrateOnStart = try source.value(Settings.migrateOnStart)
        if url == nil && !embedded { throw Self.noDatabase }
    }

    /// Neither `DATABASE_URL` nor, with `SIWA_EMBEDDED_DATABASE=off`, the embedded cluster.
    static let noDatabase = ConfigurationError(
        variable: "DATABASE_URL",
        message: "is not set and SIWA_EMBEDDED_DATABASE=off: set DATABASE_URL to your PostgreSQL server, e.g. postgres://siwa:secret@db.internal:5432/siwa")
}
