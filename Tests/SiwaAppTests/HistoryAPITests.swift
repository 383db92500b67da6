import Foundation
import HTTPTypes
import Hummingbird
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaEmbeddedPostgres
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// The event history API through real HTTP on a real database.
@Suite("History API: notifications, timeline, stats, rejections, export, OpenAPI", .timeLimit(.minutes(10)))
struct HistoryAPITests {
    static func items(_ answer: TestServer.Answer) -> [JSONValue] { answer.json?["items"]?.arrayValue ?? [] }

    @Test("list: filters, newest first, keyset pages stable while new notifications arrive; bad parameters are named")
    func list() async throws {
        let e = try await EffectHarness.start()
        let token = try await API.token(e.h, [.notificationsRead])
        for index in 0..<5 { try await e.post("consent-revoked", sub: "hist-a", at: Int64(index) * 1_000, jti: "a-\(index)") }
        try await e.post("email-disabled", sub: "hist-b", at: 10_000, email: "b@privaterelay.appleid.com", jti: "b-0")
        try await e.drain()
        let all = try await API.call(e.h, .GET, "/v1/notifications", token: token)
        #expect(all.status == 200)
        #expect(Self.items(all).compactMap { $0["jti"]?.stringValue } == ["b-0", "a-4", "a-3", "a-2", "a-1", "a-0"])
        #expect(Self.items(all).first?["status"] == .string("applied"))

        let first = try await API.call(e.h, .GET, "/v1/notifications?sub=hist-a&limit=2", token: token)
        #expect(Self.items(first).compactMap { $0["jti"]?.stringValue } == ["a-4", "a-3"])
        let cursor = try #require(first.json?["next_cursor"]?.stringValue)
        try await e.post("consent-revoked", sub: "hist-a", at: 99_000, jti: "a-new")  // arrives between pages
        let second = try await API.call(e.h, .GET, "/v1/notifications?sub=hist-a&limit=2&cursor=\(cursor)", token: token)
        #expect(Self.items(second).compactMap { $0["jti"]?.stringValue } == ["a-2", "a-1"])
        let byType = try await API.call(e.h, .GET, "/v1/notifications?type=email-disabled&status=applied", token: token)
        #expect(Self.items(byType).compactMap { $0["jti"]?.stringValue } == ["b-0"])
        let byEventTime = try await API.call(
            e.h, .GET, "/v1/notifications?time_field=event_time&sub=hist-a&limit=1", token: token)
        #expect(Self.items(byEventTime).first?["jti"] == .string("a-new"))

        for (query, parameter) in [
            ("status=done", "status"), ("time_field=sent_at", "time_field"), ("from=yesterday", "from"), ("limit=5000", "limit"),
            ("cursor=bm9wZQ", "cursor"),
        ] {
            let bad = try await API.call(e.h, .GET, "/v1/notifications?\(query)", token: token)
            #expect(bad.status == 400, "\(query)")
            #expect(bad.json?["message"]?.stringValue?.hasPrefix(parameter) == true, "\(query): \(bad.body)")
        }
        // An empty range matches nothing; an empty parameter is no filter.
        let empty = try await API.call(e.h, .GET, "/v1/notifications?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", token: token)
        #expect(empty.status == 200 && Self.items(empty).isEmpty, "\(empty.body)")
        let blank = try await API.call(e.h, .GET, "/v1/notifications?sub=&cursor=&aud=", token: token)
        #expect(Self.items(blank).count == 7, "\(blank.body)")
        let sessionsOnly = try await API.token(e.h, [.sessionsRead])
        let denied = try await API.call(e.h, .GET, "/v1/notifications", token: sessionsOnly)
        #expect(denied.status == 403 && denied.json?["message"]?.stringValue?.contains("notifications:read") == true)
        await e.stop()
    }

    @Test("An unknown filter value is a 400 naming the valid ones; every list has the one maximum, and over it is a 400 naming it")
    func unknownFiltersAndTheMaximum() async throws {
        let e = try await EffectHarness.start()
        let token = try await API.token(e.h, [.admin])
        try await e.post("consent-revoked", sub: "filter-a", at: 10, jti: "filter-1")
        let types = "email-disabled, email-enabled, consent-revoked, account-delete"
        for (path, named) in [
            ("/v1/notifications?type=consent_revoked", types), ("/v1/notifications/export?type=revoked", types),
            ("/v1/stats/notifications?type=consent_revoked", types), ("/v1/notifications?status=done", "pending, applied, skipped, retrying, discarded"),
            ("/v1/rejections?reason=unknown_kid", "unknown_key"), ("/v1/alerts?state=open", "firing or resolved"),
        ] {
            let answer = try await API.call(e.h, .GET, path, token: token)
            #expect(answer.status == 400 && answer.json?["error"] == .string("invalid_request"), "\(path): \(answer.status) \(answer.body)")
            #expect(answer.json?["message"]?.stringValue?.contains(named) == true, "\(path): \(answer.body)")
        }
        // Both spellings of the deletion event filter alike; a valid type answers its rows.
        for query in ["type=consent-revoked", "type=account-deleted&type=consent-revoked"] {
            let answer = try await API.call(e.h, .GET, "/v1/notifications?\(query)", token: token)
            #expect(Self.items(answer).map { $0["jti"] } == [.string("filter-1")], "\(query): \(answer.body)")
        }
        for path in [
            "/v1/notifications", "/v1/accounts/com.example.app/filter-a/timeline", "/v1/rejections", "/v1/alerts",
            "/v1/accounts/com.example.app/filter-a/sessions",
        ] {
            let atMaximum = try await API.call(e.h, .GET, "\(path)?limit=\(ListLimit.maximum)", token: token)
            #expect(atMaximum.status == 200, "\(path): \(atMaximum.body)")
            let over = try await API.call(e.h, .GET, "\(path)?limit=\(ListLimit.maximum + 1)", token: token)
            #expect(over.status == 400 && over.json?["message"]?.stringValue?.contains("from 1 to \(ListLimit.maximum)") == true, "\(path): \(over.body)")
        }
        let document = try await e.h.server.request(.GET, "/openapi.yaml")
        #expect(document.body.contains("maximum: \(ListLimit.maximum)}") && !document.body.contains("maximum: 10000"))
        await e.stop()
    }

    @Test("show: verification facts, deliveries and the attempt log; timeline: the user's events with what each changed")
    func showAndTimeline() async throws {
        let e = try await EffectHarness.start()
        let token = try await API.token(e.h, [.notificationsRead])
        _ = try await e.session(sub: "hist-c", createdAt: 500)
        try await e.post("email-disabled", sub: "hist-c", at: 1_000, email: "c@privaterelay.appleid.com", jti: "c-1")
        try await e.post("consent-revoked", sub: "hist-c", at: 2_000, jti: "c-2")
        try await e.drain()
        let shown = try await API.call(e.h, .GET, "/v1/notifications/c-2", token: token)
        #expect(shown.status == 200)
        #expect(shown.json?["verification"]?["kid"]?.stringValue?.isEmpty == false)
        #expect(shown.json?["verification"]?["alg"] == .string("RS256"))
        #expect(shown.json?["verification"]?["iss"] == .string("https://appleid.apple.com"))
        // The job in each lane as it stands: the effect is done; callbacks are off on this server.
        let jobs = shown.json?["jobs"]?.arrayValue ?? []
        #expect(jobs.map { [$0["lane"], $0["state"], $0["attempt"], $0["webhook_id"]] } == [[.string("effects"), .string("completed"), .number(1), .null]])
        #expect(shown.json?["callback_url"] == .null)
        let attempts = shown.json?["attempts"]?.arrayValue ?? []
        #expect(attempts.count == 1)
        #expect(attempts.first?["outcome"] == .string("applied"))
        #expect(attempts.first?["effect"] == .string("consent_revoked"))
        #expect(attempts.first?["revoked_sessions"] == .number(1))
        #expect(try await API.call(e.h, .GET, "/v1/notifications/nope", token: token).status == 404)

        let timeline = try await API.call(e.h, .GET, "/v1/accounts/com.example.app/hist-c/timeline", token: token)
        let entries = Self.items(timeline)
        #expect(entries.compactMap { $0["jti"]?.stringValue } == ["c-1", "c-2"])
        #expect(entries.compactMap { $0["effect"]?.stringValue } == ["email_forwarding_disabled", "consent_revoked"])
        await e.stop()
    }

    @Test("email addresses only for tokens with accounts:read: list, show, timeline and export answer null and email_withheld to the others")
    func emailWithheld() async throws {
        let e = try await EffectHarness.start()
        let address = "hist-e@privaterelay.appleid.com"
        try await e.post("email-disabled", sub: "hist-e", at: 1_000, email: address, jti: "e-1")
        try await e.drain()
        let historyOnly = try await API.token(e.h, [.notificationsRead])
        let withAccounts = try await API.token(e.h, [.notificationsRead, .accountsRead])
        let paths = ["/v1/notifications", "/v1/notifications/e-1", "/v1/accounts/com.example.app/hist-e/timeline", "/v1/notifications/export"]
        for path in paths {
            let withheld = try await API.call(e.h, .GET, path, token: historyOnly)
            #expect(withheld.status == 200, "\(path)")
            #expect(!withheld.body.contains(address), "\(path): \(withheld.body)")
            let record = path.hasSuffix("export") ? JSONValue.parse(Data(withheld.body.utf8)) : (Self.items(withheld).first ?? withheld.json)
            #expect(record?["email"] == .null && record?["email_withheld"] == .bool(true), "\(path): \(withheld.body)")
            let shown = try await API.call(e.h, .GET, path, token: withAccounts)
            #expect(shown.body.contains(address), "\(path)")
            let full = path.hasSuffix("export") ? JSONValue.parse(Data(shown.body.utf8)) : (Self.items(shown).first ?? shown.json)
            #expect(full?["email"] == .string(address) && full?["email_withheld"] == .bool(false), "\(path): \(shown.body)")
        }
        await e.stop()
    }

    @Test("stats count per bucket and type; rejections list with totals; export streams every matching row as NDJSON")
    func statsRejectionsExport() async throws {
        let e = try await EffectHarness.start()
        let token = try await API.token(e.h, [.notificationsRead])
        for index in 0..<3 { try await e.post("consent-revoked", sub: "stats-\(index)", at: Int64(index)) }
        try await e.post("account-delete", sub: "stats-9", at: 5)
        _ = try await e.h.server.post(jws: try e.h.forged(header: ["alg": "none", "kid": "x"]))
        await e.h.flushRejections()
        let stats = try await API.call(e.h, .GET, "/v1/stats/notifications?bucket=hour", token: token)
        #expect(stats.status == 200)
        let buckets = Self.items(stats)
        #expect(buckets.count == 1)
        #expect(buckets.first?["counts"]?["consent-revoked"] == .number(3))
        #expect(buckets.first?["counts"]?["account-delete"] == .number(1))
        #expect(buckets.first?["total"] == .number(4))
        let filtered = try await API.call(e.h, .GET, "/v1/stats/notifications?bucket=minute&type=account-delete", token: token)
        #expect(Self.items(filtered).first?["total"] == .number(1))
        #expect(try await API.call(e.h, .GET, "/v1/stats/notifications?bucket=week", token: token).status == 400)

        _ = try await e.h.server.post(jws: try e.h.forged(header: ["alg": "HS256", "kid": "x"]))
        await e.h.flushRejections()
        let rejections = try await API.call(e.h, .GET, "/v1/rejections?limit=1", token: token)
        #expect(Self.items(rejections).first?["reason"] == .string("unsupported_algorithm"))
        let rejectionCursor = try #require(rejections.json?["next_cursor"]?.stringValue)
        let older = try await API.call(e.h, .GET, "/v1/rejections?limit=1&cursor=\(rejectionCursor)", token: token)
        #expect(Self.items(older).count == 1)
        #expect(Self.items(older).first?["id"] != Self.items(rejections).first?["id"])
        #expect(older.json?["next_cursor"] == .null)
        #expect(rejections.json?["totals"]?.arrayValue?.contains { $0["reason"] == .string("unsupported_algorithm") } == true)

        let export = try await API.call(e.h, .GET, "/v1/notifications/export?type=consent-revoked", token: token)
        #expect(export.status == 200)
        #expect(export.headers.first(name: "content-type") == "application/x-ndjson")
        let lines = export.body.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8)) }
        #expect(lines.count == 3)
        #expect(Set(lines.compactMap { $0["sub"]?.stringValue }) == ["stats-0", "stats-1", "stats-2"])
        await e.stop()
    }

    @Test("export pages through more rows than one page without repeating or skipping any (shared received_at)")
    func exportManyRows() async throws {
        let h = try await Harness.start()
        try await BulkLoad.notifications(count: 2_500, users: 2_500, aud: Harness.aud, client: h.server.client)  // one transaction: one received_at
        let token = try await API.token(h, [.notificationsRead])
        let export = try await API.call(h, .GET, "/v1/notifications/export", token: token)
        let jtis = export.body.split(separator: "\n").compactMap { JSONValue.parse(Data($0.utf8))?["jti"]?.stringValue }
        #expect(jtis.count == 2_500)
        #expect(Set(jtis).count == 2_500)
        await h.stop()
    }

    @Test("/openapi.yaml is served without a token, and schemathesis's checks find no server error, schema violation, undocumented status or method")
    func openAPIContract() async throws {
        // With Apple credentials (the stand-in), so authorization_code bodies reach Apple's refusal.
        let apple = try await StandInCredentials.start(signer: ExchangeFixture.signer, clientIDs: [Harness.aud])
        let e = try await EffectHarness.start(server: { $0.appleCredentials = apple.credentials })
        let document = try await e.h.server.request(.GET, "/openapi.yaml")
        #expect(document.status == 200)
        #expect(document.body.hasPrefix("openapi: 3.1"))
        let token = try await API.token(e.h, [.admin])
        _ = try await e.session(sub: "st-1", createdAt: 1)
        try await e.post("consent-revoked", sub: "st-1", at: 10, jti: "st-jti")
        try await e.drain()
        let schemathesis = try #require(Executables.find("st"), "schemathesis' st is not on PATH: scripts/test installs it")
        let result = try await Subprocess.run(
            schemathesis,
            ["run", "\(e.h.server.adminBaseURL)/openapi.yaml", "--header", "Authorization: Bearer \(token)",
             // Every check but use_after_free: DELETE /v1/sessions/{id} logs out and keeps the
             // session readable (revoked, with its reason). Tests/contract/schemathesis_hooks.py
             // supplies what no schema states (a future expires_at, a configured aud, no made-up cursor).
             "--checks", "all", "--exclude-checks", "use_after_free",
             "--max-examples", "30", "--no-color", "--seed", "20261125",
             // A bound against a hang, not a speed check: schemathesis's default 10 s failed one
             // request (GET /v1/notifications?type=0) in a full suite on a VM slowed 4-5x.
             "--request-timeout", "60"],
            environment: ProcessInfo.processInfo.environment.merging([
                "SCHEMATHESIS_TELEMETRY": "false", "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                "PYTHONPATH": Repository.root.appendingPathComponent("Tests/contract").path,
            ]) { $1 })
        #expect(result.succeeded, "\(result.standardOutput.suffix(6000))\n\(result.standardError.suffix(2000))")
        #expect(result.standardOutput.contains("Tested: 18"), "every documented operation was exercised")
        await e.stop()
        await apple.stop()
    }

    /// The document's "METHOD /path" pairs (paths as Hummingbird writes them: `{param}`).
    static func documentedOperations() throws -> Set<String> {
        let text = try String(contentsOf: Repository.root.appendingPathComponent("Sources/SiwaHTTP/openapi.yaml"), encoding: .utf8)
        var operations = Set<String>()
        var path: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("  /"), line.hasSuffix(":") {
                path = String(line.dropFirst(2).dropLast())
            } else if !line.hasPrefix("  ") {
                path = nil
            } else if let current = path, line.hasPrefix("    "), line.hasSuffix(":"),
                ["get", "put", "post", "delete", "patch", "head", "options", "trace"].contains(line.dropFirst(4).dropLast())
            {
                operations.insert("\(line.dropFirst(4).dropLast().uppercased()) \(current)")
            }
        }
        return operations
    }

    @Test("The admin listener's routes and the document's operations are the same, both ways; every other method on a path is 405 with Allow")
    func routesMatchDocument() async throws {
        let h = try await Harness.start()
        let documented = try Self.documentedOperations()
        #expect(documented.count == 19)
        let registered = Set(h.server.application.adminRouter(methodNotAllowed: false).routes.map { "\($0.method.rawValue) \($0.path)" })
        // The dashboard's files are the page, not the API.
        let served = registered.subtracting(["GET /", "GET /app.js", "GET /app.css", "GET /metrics"])
        #expect(served.subtracting(documented).isEmpty, "registered but not documented: \(served.subtracting(documented).sorted())")
        #expect(documented.subtracting(served).isEmpty, "documented but not registered: \(documented.subtracting(served).sorted())")
        for (method, path, allow) in [(HTTPMethod.PUT, "/v1/notifications", "GET, HEAD"), (.DELETE, "/v1/sessions", "POST"), (.POST, "/metrics", "GET, HEAD")] {
            let answer = try await h.server.request(method, path)
            #expect(answer.status == 405 && answer.headers.first(name: "allow") == allow, "\(method) \(path): \(answer.status) \(answer.headers)")
            #expect(answer.json?["error"] == .string("method_not_allowed"))
        }
        await h.stop()
    }

    @Test("retention: notifications past SIWA_HISTORY_RETENTION go in batches, with their jobs and attempts; unapplied ones stay; stats follow")
    func retention() async throws {
        let endpoint = try await CallbackEndpoint.start()
        let e = try await EffectHarness.start { configuration in
            configuration.lanes.callbacks = .init(url: endpoint.url, signer: try! WebhookSigner(secrets: TestWebhooks.secret))
            configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
        }
        let h = e.h
        let client = h.server.client
        let token = try await API.token(h, [.notificationsRead])
        /// Stats totals per type over the last hour, as the API answers them.
        func statsTotals() async throws -> [String: Double] {
            let answer = try await API.call(h, .GET, "/v1/stats/notifications?bucket=day", token: token)
            #expect(answer.status == 200)
            var totals: [String: Double] = [:]
            for item in Self.items(answer) {
                for (type, count) in item["counts"]?.objectValue ?? [:] { totals[type, default: 0] += count.numberValue ?? 0 }
            }
            return totals
        }
        /// The same, counted from the notifications themselves.
        func storedTotals() async throws -> [String: Double] {
            var totals: [String: Double] = [:]
            for try await (type, count) in try await client.query("SELECT type, count(*)::bigint FROM notifications GROUP BY type").decode((String, Int).self) {
                totals[type] = Double(count)
            }
            return totals
        }
        // One notification through the service: its effect applied, its callback answered 500 and
        // then 200 — two jobs and three attempts, as the API shows them.
        try await e.post("consent-revoked", sub: "001.retained.1", at: 1_000, jti: "retained-1")
        #expect(try await e.drain() == 1)
        endpoint.answer([500])
        #expect(try await e.deliverCallbacks() == 1)
        #expect(try await e.deliverCallbacks() == 1)
        let shown = try await API.call(h, .GET, "/v1/notifications/retained-1", token: token)
        #expect((shown.json?["jobs"]?.arrayValue ?? []).compactMap { $0["lane"]?.stringValue }.sorted() == ["callbacks", "effects"], "\(shown.body)")
        let outcomes = (shown.json?["attempts"]?.arrayValue ?? []).compactMap { $0["outcome"]?.stringValue }
        #expect(outcomes.sorted() == ["applied", "delivered", "retrying"], "\(shown.body)")
        #expect(try await h.count("SELECT count(*) FROM job_attempts") == 3)

        try await BulkLoad.notifications(count: 2_500, users: 2_500, aud: Harness.aud, client: client)
        try await client.query("UPDATE notifications SET status = 'applied' WHERE id % 10 <> 0 AND jti LIKE 'bulk-%'")  // a tenth still pending
        let history = HistoryStore(client: client, logger: h.logs.logger())
        let notifications = NotificationStore(client: client, logger: h.logs.logger())
        // Counted the moment they commit (deltas not folded yet), and the same after the fold.
        let loaded = try await storedTotals()
        #expect(loaded.values.reduce(0, +) == 2_501)
        #expect(try await statsTotals() == loaded)
        #expect(try await history.foldCounts() > 0)
        #expect(try await statsTotals() == loaded)

        #expect(try await notifications.prune(retention: .seconds(3600)) == 0)  // all received just now: within retention
        // A zero retention: every row committed before this statement is past it.
        #expect(try await notifications.prune(retention: .zero) == 1_000)  // one batch at a time
        while try await notifications.prune(retention: .zero) > 0 {}
        #expect(try await h.count("SELECT count(*) FROM notifications") == 250)
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE status <> 'pending'") == 0)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 250)
        // The notification that went through the service: gone with its jobs and their attempts.
        #expect(try await API.call(h, .GET, "/v1/notifications/retained-1", token: token).status == 404)
        #expect(try await h.count("SELECT count(*) FROM job_attempts") == 0)
        // Pruned notifications leave the stats too, before and after folding.
        let kept = try await storedTotals()
        #expect(kept.values.reduce(0, +) == 250)
        #expect(try await statsTotals() == kept)
        while try await history.foldCounts() > 0 {}
        #expect(try await statsTotals() == kept)
        #expect(try await h.count("SELECT count(*) FROM notification_count_deltas") == 0)
        await e.stop()
        await endpoint.stop()
    }
}
