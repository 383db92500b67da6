import SiwaStore
import Testing

/// The migration splitter: top-level semicolons end statements; comments, quotes and dollar
/// bodies hide theirs.
@Suite("Migrations split into statements", .timeLimit(.minutes(10)))
struct SQLStatementsTests {
    @Test("semicolons in comments, strings, identifiers and dollar bodies do not split; comments go; empty statements are dropped")
    func splits() {
        let sql = """
            -- a comment; with a semicolon
            CREATE TABLE "odd;name" (v text DEFAULT 'it''s; fine');;
            /* a block /* nested; */ comment */ INSERT INTO t VALUES ('x');
            CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;
            DO $$ BEGIN PERFORM 1; END $$
            """
        #expect(SQLStatements.split(sql) == [
            #"CREATE TABLE "odd;name" (v text DEFAULT 'it''s; fine')"#,
            "INSERT INTO t VALUES ('x')",
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$",
            "DO $$ BEGIN PERFORM 1; END $$",
        ])
    }

    @Test("an unclosed string or dollar body runs to the end of the file")
    func unclosed() {
        #expect(SQLStatements.split("SELECT 'a;b") == ["SELECT 'a;b"])
        #expect(SQLStatements.split("SELECT $x$ a; b") == ["SELECT $x$ a; b"])
        #expect(SQLStatements.split("SELECT 1; SELECT $1") == ["SELECT 1", "SELECT $1"])
    }
}
