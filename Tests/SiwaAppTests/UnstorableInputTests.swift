import Foundation
import NIOHTTP1
import SiwaApp
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import Testing

/// What one request can make the database refuse must cost that request only: rejection recording,
/// the per-minute counts and the neighbours in a commit batch carry on.
@Suite("Values the database refuses", .timeLimit(.minutes(10)))
struct UnstorableInputTests {
    /// `count` characters of random base64url: text PostgreSQL cannot compress below its limits.
    static func randomText(_ count: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<(count * 3 / 4 + 3)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return String(Base64URL.encode(Data(bytes)).prefix(count))
    }

    @Test("A forged token whose sub is 30,000 random characters is recorded bounded, and later rejections and counts are still written")
    func hugeUnverifiedValues() async throws {
        let h = try await Harness.start()
        let impostor = try AppleStyleSigner.generate()
        let huge = Self.randomText(30_000)
        var claims = AppleStyleSigner.claims(aud: Harness.aud, type: "consent-revoked", sub: huge, eventTime: Date(), issuedAt: Date()).objectValue!
        claims["jti"] = .string(Self.randomText(10_000))
        let forged = try impostor.sign(header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]), claims: .object(claims))
        #expect(try await h.server.post(jws: forged).json?["reason"] == .string("bad_signature"))
        await h.flushRejections()
        // A genuine token for a mistyped bundle ID afterwards: kept whole for `rejections replay`.
        let typo = try h.signer.notification(aud: "com.example.typo", type: "consent-revoked", sub: "001.typo.1", jti: "typo-1")
        #expect(try await h.server.post(jws: typo).json?["reason"] == .string("wrong_audience"))
        await h.flushRejections()

        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'wrong_audience' AND token IS NOT NULL") == 1)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'bad_signature'") == 1)
        #expect(try await h.count("SELECT max(octet_length(sub))::bigint FROM rejections") <= UntrustedText.maximumBytes)
        #expect(try await h.count("SELECT max(octet_length(jti))::bigint FROM rejections") <= UntrustedText.maximumBytes)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE sub LIKE '%…[+% bytes]'") == 1)
        #expect(try await h.count("SELECT coalesce(sum(recorded), 0)::bigint FROM rejection_counts WHERE reason IN ('bad_signature', 'wrong_audience')") == 2)
        // The log line carries the bounded values too.
        let line = try #require(h.logs.all.first { $0.contains("reason=bad_signature") })
        #expect(line.utf8.count < 2_000, "\(line.utf8.count) bytes")
        await h.stop()
    }

    @Test("A rejection row the database refuses (a constraint) is dropped and counted; the counts and the rows after it are written")
    func refusedRejectionRowDropped() async throws {
        let h = try await Harness.start()
        // Any refusal that is about the row, not the database: here a constraint the test adds.
        _ = try await h.count("ALTER TABLE rejections ADD CONSTRAINT refuse_poison CHECK (kid IS DISTINCT FROM 'poison') NOT VALID")
        let poison = try h.forged(header: ["kid": .string("poison"), "alg": .string("RS256")])
        #expect(try await h.server.post(jws: poison).json?["reason"] == .string("unknown_key"))
        let typo = try h.signer.notification(aud: "com.example.typo", type: "consent-revoked", sub: "001.typo.2", jti: "typo-2")
        #expect(try await h.server.post(jws: typo).json?["reason"] == .string("wrong_audience"))
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'wrong_audience' AND token IS NOT NULL") == 1)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE kid = 'poison'") == 0)
        #expect(try await h.count("SELECT coalesce(sum(recorded), 0)::bigint FROM rejection_counts WHERE reason IN ('unknown_key', 'wrong_audience')") == 2)
        #expect(h.logs.all.filter { $0.contains("rejection record refused by the database; dropped") }.count == 1)
        // Not kept for retry: the next batch writes only what is new.
        let impostor = try AppleStyleSigner.generate()
        let forged = try impostor.sign(header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]), claims: AppleStyleSigner.claims(aud: Harness.aud, type: "consent-revoked", sub: "s", eventTime: Date(), issuedAt: Date()))
        #expect(try await h.server.post(jws: forged).json?["reason"] == .string("bad_signature"))
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections") == 2)
        #expect(h.logs.all.filter { $0.contains("rejection record refused by the database; dropped") }.count == 1)
        let metrics = try await h.server.request(.GET, "/metrics")
        #expect(metrics.body.contains("siwa_rejections_dropped_total 1"), "\(metrics.body.split(separator: "\n").filter { $0.contains("dropped") })")
        await h.stop()
    }

    @Test("A signed notification the database cannot store is answered 422 alone, every time; its batch neighbours are accepted")
    func unstorableNotificationFailsAlone() async throws {
        let h = try await Harness.start()
        // Alone: a jti too large for its unique index (SQLSTATE 54000), refused at once, twice.
        let huge = try h.notification(sub: "001.huge.1", jti: Self.randomText(30_000))
        for _ in 0..<2 {
            let answer = try await h.server.post(jws: huge)
            #expect(answer.status == 422, "\(answer.body)")
            #expect(answer.json?["error"] == .string("unstorable_notification"))
            #expect(answer.json?["message"]?.stringValue?.contains("54000") == true, "\(answer.body)")
        }
        // In a batch: two deliveries hold both commit slots (waiting for a lock); the unstorable
        // one and three others queue and are committed together once the lock is gone.
        let blockers = try (0..<2).map { try h.notification(sub: "001.blocker.\($0)", jti: "blocker-\($0)") }
        let batch = try [h.notification(sub: "001.huge.2", jti: Self.randomText(30_000))]
            + (0..<3).map { try h.notification(sub: "001.neighbour.\($0)", jti: "neighbour-\($0)") }
        let answers = try await h.withInsertsBlocked {
            let blocking = blockers.map { jws in Task { try await h.server.post(jws: jws) } }
            let slots = await h.server.application.committer.wait(committing: 2, within: .seconds(30))
            #expect(slots, "the blockers never took both commit slots")
            let queued = batch.map { jws in Task { try await h.server.post(jws: jws) } }
            let waiting = await h.server.application.committer.wait(committing: 2, queued: batch.count, within: .seconds(30))
            #expect(waiting && h.server.application.committer.queued == batch.count, "\(h.server.application.committer.queued) of \(batch.count) queued")
            return (blocking, queued)
        }
        for task in answers.0 { #expect(try await task.value.status == 200) }
        let batchAnswers = try await answers.1.asyncMap { try await $0.value }
        #expect(batchAnswers[0].status == 422, "\(batchAnswers[0].body)")
        for answer in batchAnswers.dropFirst() {
            #expect(answer.status == 200 && answer.json?["status"] == .string("accepted"), "\(answer.body)")
        }
        #expect(try await h.count("SELECT count(*) FROM notifications") == 5)
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE octet_length(jti) > 256") == 0)
        await h.stop()
    }
}

extension Array {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var result: [T] = []
        for element in self { result.append(try await transform(element)) }
        return result
    }
}

@Suite("Durable answers whatever the database's defaults", .timeLimit(.minutes(10)))
struct DurableCommitTests {
    @Test("Under a role whose default is synchronous_commit=off the ingest transaction commits with on; remote_apply is kept")
    func synchronousCommitRaised() async throws {
        let database = try await TestCluster.shared.makeDatabase()
        // What the ingest transaction runs under, seen from inside it by a trigger on its insert.
        try await Harness.execute(on: database, [
            "CREATE TABLE seen_sync (setting text NOT NULL)",
            """
            CREATE FUNCTION record_sync() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN INSERT INTO seen_sync VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$
            """,
            "CREATE TRIGGER record_sync AFTER INSERT ON notifications FOR EACH ROW EXECUTE FUNCTION record_sync()",
        ])
        for (roleDefault, expected) in [("off", "on"), ("local", "on"), ("remote_apply", "remote_apply")] {
            try await Harness.execute(on: database, ["DO $$ BEGIN EXECUTE format('ALTER ROLE CURRENT_USER IN DATABASE %I SET synchronous_commit = \(roleDefault)', current_database()); END $$"])
            let h = try await Harness.start(database: database)
            // New connections take the role's default…
            #expect(try await h.count("SELECT count(*) FROM (SELECT 1 WHERE current_setting('synchronous_commit') = '\(roleDefault)') s") == 1)
            #expect(try await h.server.post(jws: try h.notification(sub: "001.sync.\(roleDefault)")).status == 200)
            // …and the ingest transaction commits with at least `on`.
            #expect(try await h.count("SELECT count(*) FROM seen_sync WHERE setting = '\(expected)'") == 1, "default \(roleDefault)")
            _ = try await h.count("DELETE FROM seen_sync")
            await h.stop()
        }
    }
}
