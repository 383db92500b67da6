import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaDomain
import SiwaHTTP
import SiwaStore
import SiwaTestSupport
import Testing

@Suite("POST /apple/notifications", .timeLimit(.minutes(10)))
struct ReceiverTests {
    @Test("A genuine notification is answered 200 accepted after it and its job are stored")
    func accepted() async throws {
        let h = try await Harness.start()
        let jti = UUID().uuidString
        let answer = try await h.server.post(jws: try h.notification(jti: jti))
        #expect(answer.status == 200)
        #expect(answer.json == .object(["status": .string("accepted"), "id": .string(jti)]))
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE jti = '\(jti)' AND status = 'pending' AND type = 'consent-revoked' AND deliveries = 1") == 1)
        #expect(try await h.count("SELECT count(*) FROM jobs j JOIN notifications n ON n.id = j.notification_id WHERE n.jti = '\(jti)' AND j.state = 'available'") == 1)
        await h.stop()
    }

    @Test("The body is parsed as JSON whatever the Content-Type says")
    func contentTypeIgnored() async throws {
        let h = try await Harness.start()
        let answer = try await h.server.request(body: AppleStyleSigner.body(try h.notification()), headers: [("Content-Type", "text/plain")])
        #expect(answer.status == 200)
        let none = try await h.server.request(body: AppleStyleSigner.body(try h.notification()), headers: [])
        #expect(none.status == 200)
        await h.stop()
    }

    @Test("The same jti again is a duplicate: no new row, deliveries counted")
    func duplicateJTI() async throws {
        let h = try await Harness.start()
        let jws = try h.notification()
        let first = try await h.server.post(jws: jws)
        let second = try await h.server.post(jws: jws)
        #expect(first.json?["status"] == .string("accepted"))
        #expect(second.status == 200)
        #expect(second.json?["status"] == .string("duplicate"))
        #expect(second.json?["id"] == first.json?["id"])
        #expect(try await h.count("SELECT count(*) FROM notifications") == 1)
        #expect(try await h.count("SELECT deliveries FROM notifications") == 2)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 1)
        await h.stop()
    }

    @Test("A commit blocked past the database timeout answers 503 by that timeout, not later; the commit that lands afterwards makes Apple's retry a duplicate")
    func commitPastDeadline() async throws {
        let h = try await Harness.start { $0.database.timeout = .seconds(2) }
        #expect(try await h.deliver(try h.notification()).status == 200)  // connections open, statements prepared
        let jws = try h.notification(jti: "blocked")
        try await h.withInsertsBlocked {
            let started = ContinuousClock.now
            let answer = try await h.server.post(jws: jws)
            let waited = ContinuousClock.now - started
            #expect(answer.status == 503)
            #expect(answer.json?["error"] == .string("unavailable"))
            #expect(answer.headers.first(name: "retry-after") != nil)
            // By the 2 s timeout (a NIO timer never fires early), not by the 60 s bound on any
            // database call: the upper bound only tells the two apart, it measures no speed.
            #expect(waited >= .milliseconds(1_900) && waited < .seconds(55), "\(waited)")
        }
        // The commit that outlived its request lands once the lock is gone.
        await h.server.application.committer.settled()
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE jti = 'blocked'") == 1)
        let retried = try await h.deliver(jws)
        #expect(retried.status == 200)
        #expect(retried.json?["status"] == .string("duplicate"))
        #expect(try await h.count("SELECT count(*) FROM jobs") == 2)
        await h.stop()
    }

    @Test("While both commit slots hang, deliveries still queued get 503 at the timeout and are dropped, not committed once the database is back")
    func queuedPastDeadlineDropped() async throws {
        let h = try await Harness.start { $0.database.timeout = .seconds(2) }
        #expect(try await h.deliver(try h.notification()).status == 200)
        // Ten distinct events (one user each): tokens signed back to back can share a millisecond
        // of event_time, and the same user's same event under another jti is a duplicate.
        let tokens = try (0..<10).map { try h.notification(sub: "001.held.\($0)", jti: "held-\($0)") }
        try await h.withInsertsBlocked {
            // The first two deliveries take the two commit slots (each a batch of its own, blocked
            // on the lock); the other eight queue behind them.
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for (index, jws) in tokens.enumerated() {
                    group.addTask { try await h.server.post(jws: jws).status }
                    if index < 2 {
                        let slots = await h.server.application.committer.wait(committing: index + 1, within: .seconds(30))
                        #expect(slots, "delivery \(index) never took a commit slot")
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses == Array(repeating: 503, count: 10))
        }
        // Once the committer has nothing left: exactly the two that were committing, whichever two
        // reached the committer first took the slots (each delivery arriving at a free slot starts
        // a batch of its own at once); nothing queued was kept to commit later.
        await h.server.application.committer.settled()
        let held = try await h.count("SELECT count(*) FROM notifications WHERE jti LIKE 'held-%'")
        #expect(held == 2, "\(held) of the 10 blocked deliveries stored")
        await h.stop()
    }

    @Test("With both commit slots busy and the commit queue full, one more delivery is answered 503 at once, nothing of it is written, and Apple's retry is accepted")
    func commitQueueFull() async throws {
        let h = try await Harness.start { $0.http.commitQueueLimit = 3 }  // the harness's 30 s database timeout
        #expect(try await h.deliver(try h.notification()).status == 200)  // connections open, statements prepared
        let tokens = try (0..<8).map { try h.notification(sub: "001.full.\($0)", jti: "full-\($0)") }
        let (answers, answered) = AsyncStream.makeStream(of: (jti: String, answer: TestServer.Answer?).self)
        @Sendable func post(_ index: Int) {
            Task { answered.yield(("full-\(index)", try? await h.server.post(jws: tokens[index]))) }
        }
        let refused: [(jti: String, answer: TestServer.Answer?)] = try await h.withInsertsBlocked {
            // Two deliveries take the two commit slots: two batches waiting for the lock.
            post(0)
            post(1)
            let slots = await h.server.application.committer.wait(committing: 2, within: .seconds(30))
            #expect(slots, "the first two deliveries never took both commit slots")
            // Six more: whichever three reach the committer first wait in its queue (the limit),
            // the other three are refused without waiting out the 30 s timeout.
            for index in 2..<8 { post(index) }
            var refused: [(jti: String, answer: TestServer.Answer?)] = []
            for await next in answers {
                refused.append(next)
                if refused.count == 3 { break }
            }
            return refused
        }
        for (jti, answer) in refused {
            #expect(answer?.status == 503, "\(jti)")
            #expect(answer?.json?["error"] == .string("unavailable"))
            #expect(answer?.json?["message"]?.stringValue?.contains("at capacity") == true, "\(answer?.body ?? "no answer")")
            #expect(answer?.headers.first(name: "retry-after") != nil)
        }
        // The lock gone, the two committing and the three queued are stored and answered.
        var kept: [(jti: String, answer: TestServer.Answer?)] = []
        for await next in answers {
            kept.append(next)
            if kept.count == 5 { break }
        }
        #expect(kept.allSatisfy { $0.answer?.status == 200 && $0.answer?.json?["status"] == .string("accepted") }, "\(kept.map { "\($0.jti): \($0.answer?.body ?? "-")" })")
        let refusedJTIs = Set(refused.map(\.jti))
        #expect(refusedJTIs.isDisjoint(with: kept.map(\.jti)) && refusedJTIs.count == 3)
        let stored = try await h.count("SELECT count(*) FROM notifications WHERE jti LIKE 'full-%'")
        let storedRefused = try await h.count("SELECT count(*) FROM notifications WHERE jti IN ('\(refusedJTIs.sorted().joined(separator: "','"))')")
        #expect(stored == 5 && storedRefused == 0, "\(stored) stored, \(storedRefused) of them refused")
        #expect(try await h.count("SELECT count(*) FROM jobs") == 6)
        let lines = h.logs.all.filter { $0.contains(" delivery ") && $0.contains("outcome=unavailable") }
        #expect(lines.count == 3 && lines.allSatisfy { $0.contains("SIWA_COMMIT_QUEUE_LIMIT") }, "\(lines)")
        // Apple retries the refused ones: accepted now.
        for jti in refusedJTIs.sorted() {
            let answer = try await h.deliver(tokens[Int(jti.dropFirst("full-".count))!])
            #expect(answer.json?["status"] == .string("accepted"), "\(jti): \(answer.body)")
        }
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE jti LIKE 'full-%'") == 8)
        await h.stop()
    }

    @Test("The same event under another jti is a duplicate answering the stored jti")
    func duplicateEvent() async throws {
        let h = try await Harness.start()
        let time = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 * 1000).rounded(.down) / 1000)
        let first = try await h.server.post(jws: try h.notification(eventTime: time, jti: "first"))
        let second = try await h.server.post(jws: try h.notification(eventTime: time, jti: "second"))
        #expect(first.json?["status"] == .string("accepted"))
        #expect(second.json == .object(["status": .string("duplicate"), "id": .string("first")]))
        #expect(try await h.count("SELECT count(*) FROM notifications") == 1)
        await h.stop()
    }

    @Test("50 concurrent copies of one jti give one row, one job, one accepted answer and 49 duplicates")
    func concurrentCopies() async throws {
        let h = try await Harness.start()
        let jws = try h.notification()
        let statuses = try await withThrowingTaskGroup(of: String?.self) { group in
            for _ in 0..<50 { group.addTask { try await h.server.post(jws: jws).json?["status"]?.stringValue } }
            return try await group.reduce(into: [String?]()) { $0.append($1) }
        }
        #expect(statuses.filter { $0 == "accepted" }.count == 1)
        #expect(statuses.filter { $0 == "duplicate" }.count == 49)
        #expect(try await h.count("SELECT count(*) FROM notifications") == 1)
        #expect(try await h.count("SELECT deliveries FROM notifications") == 50)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 1)
        await h.stop()
    }

    @Test("Concurrent deliveries share commits yet each gets its own answer: 300 distinct, their copies, and same-event twins")
    func groupCommit() async throws {
        let h = try await Harness.start()
        let time = Date(timeIntervalSince1970: (Date().timeIntervalSince1970).rounded(.down))
        var bodies: [(expected: String, jws: String)] = []
        for index in 0..<300 {
            bodies.append(("accepted:g\(index)", try h.notification(sub: "001.group.\(index)", eventTime: time, jti: "g\(index)")))
        }
        let answers = try await withThrowingTaskGroup(of: (String, String).self) { group in
            for (expected, jws) in bodies {
                group.addTask {
                    let json = try await h.server.post(jws: jws).json
                    return (expected, "\(json?["status"]?.stringValue ?? "?"):\(json?["id"]?.stringValue ?? "?")")
                }
            }
            return try await group.reduce(into: [(String, String)]()) { $0.append($1) }
        }
        #expect(answers.allSatisfy { $0.0 == $0.1 })
        // Shared: rows inserted by one transaction carry its id (xmin); 300 rows, far fewer commits.
        let commits = try await h.count("SELECT count(DISTINCT xmin::text) FROM notifications")
        #expect(commits < 300, "every notification had a commit of its own")
        // Copies and twins (same event, other jti) of stored ones, concurrently.
        let again = try await withThrowingTaskGroup(of: String?.self) { group in
            for index in 0..<100 {
                let copy = bodies[index].jws
                let twin = try h.notification(sub: "001.group.\(index)", eventTime: time, jti: "twin\(index)")
                group.addTask { try await h.server.post(jws: copy).json?["status"]?.stringValue }
                group.addTask { try await h.server.post(jws: twin).json?["id"]?.stringValue }
            }
            return try await group.reduce(into: [String?]()) { $0.append($1) }
        }
        #expect(again.filter { $0 == "duplicate" }.count == 100)
        #expect(again.filter { $0?.hasPrefix("g") == true }.count == 100)
        #expect(try await h.count("SELECT count(*) FROM notifications") == 300)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 300)
        #expect(try await h.count("SELECT sum(deliveries)::bigint FROM notifications") == 500)
        await h.stop()
    }

    @Test("A genuine token whose events can't be read is stored as skipped (unreadable_event), answered 200, with no job")
    func unreadableEventStored() async throws {
        let h = try await Harness.start()
        let cases: [(String, (inout [String: JSONValue]) -> Void)] = [
            ("bad-json", { $0["events"] = .string("{not json") }),
            ("no-sub", { $0["events"] = .string(#"{"type":"consent-revoked","event_time":1}"#) }),
            ("no-type", { $0["events"] = .string(#"{"sub":"x"}"#) }),
        ]
        for (jti, edit) in cases {
            let answer = try await h.server.post(jws: try h.forged { $0["jti"] = .string(jti); edit(&$0) })
            #expect(answer.status == 200, "\(jti)")
            #expect(answer.json?["status"] == .string("accepted"))
        }
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE status = 'skipped' AND skip_reason = 'unreadable_event'") == 3)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 0)
        let listed = try await h.server.application.store.list(NotificationFilter(status: .skipped))
        #expect(Set(listed.map(\.jti)) == ["bad-json", "no-sub", "no-type"])
        await h.stop()
    }

    @Test("An unknown event type is stored as skipped (unknown_type) with its sub and raw type, and counted")
    func unknownType() async throws {
        let h = try await Harness.start()
        let answer = try await h.server.post(jws: try h.notification(type: "phone-number-changed"))
        #expect(answer.status == 200)
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE status = 'skipped' AND skip_reason = 'unknown_type' AND raw_type = 'phone-number-changed' AND sub IS NOT NULL") == 1)
        let metrics = try await h.server.request(.GET, "/metrics")
        #expect(metrics.body.contains(#"siwa_notifications_skipped_total{reason="unknown_type"} 1"#))
        await h.stop()
    }

    @Test("account-deleted is stored under the canonical account-delete with the raw spelling kept")
    func deletionSpelling() async throws {
        let h = try await Harness.start()
        _ = try await h.server.post(jws: try h.notification(type: "account-deleted"))
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE type = 'account-delete' AND raw_type = 'account-deleted' AND status = 'pending'") == 1)
        await h.stop()
    }

    @Test("Malformed requests get 400 malformed_request and store nothing but a rejection record")
    func malformed() async throws {
        let h = try await Harness.start()
        let bodies = ["not json", "[]", #"{"nopayload": 1}"#, #"{"payload": 5}"#, #"{"payload": "a.b"}"#, #"{"payload": "a.b.c"}"#, #"{"payload": "e30.e30.e30.e30"}"#]
        for body in bodies {
            let answer = try await h.server.request(body: body)
            #expect(answer.status == 400, "\(body)")
            #expect(answer.json?["error"] == .string("malformed_request"), "\(body)")
            #expect(answer.json?["message"]?.stringValue?.isEmpty == false)
            #expect(answer.headers.first(name: "content-type") == "application/json")
        }
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 0)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE reason = 'malformed_request'") == bodies.count)
        await h.stop()
    }

    @Test("Each token failure gets 401 invalid_token with its reason, and nothing is stored but the rejection")
    func tokenFailures() async throws {
        let h = try await Harness.start()
        let impostor = try AppleStyleSigner.generate()
        let kid = h.signer.kid
        let cases: [(RejectionReason, String)] = [
            (.badSignature, try impostor.sign(header: .object(["kid": .string(kid), "alg": .string("RS256")]), claims: AppleStyleSigner.claims(aud: Harness.aud, type: "consent-revoked", sub: "s", eventTime: Date(), issuedAt: Date()))),
            (.unsupportedAlgorithm, try h.forged(header: ["kid": .string(kid), "alg": .string("HS256")])),
            (.unsupportedAlgorithm, try h.forged(header: ["kid": .string(kid), "alg": .string("none")])),
            (.unsupportedHeader, try h.signer.sign(
                header: .object(["kid": .string(kid), "alg": .string("RS256"), "crit": .array([.string("b64")]), "b64": .bool(false)]),
                claims: AppleStyleSigner.claims(aud: Harness.aud, type: "consent-revoked", sub: "s", eventTime: Date(), issuedAt: Date()))),
            (.wrongIssuer, try h.forged { $0["iss"] = .string("https://appleid.apple.com.evil") }),
            (.wrongAudience, try h.forged { $0["aud"] = .string("com.example.typo") }),
            (.expired, try h.forged { $0["iat"] = .number(Date().timeIntervalSince1970 - 200_000); $0["exp"] = .number(Date().timeIntervalSince1970 - 100_000) }),
            (.notYetValid, try h.forged { $0["iat"] = .number(Date().timeIntervalSince1970 + 3600) }),
            (.missingExpiry, try h.forged { $0["exp"] = nil }),
        ]
        for (reason, jws) in cases {
            let answer = try await h.server.post(jws: jws)
            #expect(answer.status == 401, "\(reason)")
            #expect(answer.json?["error"] == .string("invalid_token"))
            #expect(answer.json?["reason"] == .string(reason.rawValue))
        }
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        #expect(try await h.count("SELECT count(*) FROM rejections") == cases.count)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL") == 1)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL AND reason = 'wrong_audience'") == 1)
        await h.stop()
    }

    @Test("A kid unknown even after a refresh is 401 unknown_key")
    func unknownKey() async throws {
        let h = try await Harness.start()
        let answer = try await h.server.post(jws: try h.forged(header: ["kid": .string("not-a-key"), "alg": .string("RS256")]))
        #expect(answer.status == 401)
        #expect(answer.json?["reason"] == .string("unknown_key"))
        await h.stop()
    }

    @Test("A body over 64 KiB gets 413 payload_too_large")
    func tooLarge() async throws {
        let h = try await Harness.start()
        let answer = try await h.server.request(body: #"{"payload":""# + String(repeating: "a", count: 70_000) + #""}"#)
        #expect(answer.status == 413)
        #expect(answer.json?["error"] == .string("payload_too_large"))
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        await h.stop()
    }

    @Test("Other methods get 405 method_not_allowed with Allow: POST")
    func methodNotAllowed() async throws {
        let h = try await Harness.start()
        for method in [HTTPMethod.GET, .PUT, .DELETE, .PATCH] {
            let answer = try await h.server.request(method, body: nil)
            #expect(answer.status == 405)
            #expect(answer.json?["error"] == .string("method_not_allowed"))
            #expect(answer.headers.first(name: "allow") == "POST")
        }
        await h.stop()
    }

    @Test("The remote address is the peer; X-Forwarded-For counts only from a trusted proxy")
    func remoteAddress() async throws {
        let untrusted = try await Harness.start()
        _ = try await untrusted.server.request(body: AppleStyleSigner.body(try untrusted.notification(jti: "u")), headers: [("X-Forwarded-For", "203.0.113.7")])
        #expect(try await untrusted.count("SELECT count(*) FROM notifications WHERE remote_addr = '127.0.0.1'") == 1)
        await untrusted.stop()
        let trusted = try await Harness.start { $0.http.trustedProxies = try! TrustedProxies(parsing: "127.0.0.1/32") }
        _ = try await trusted.server.request(body: AppleStyleSigner.body(try trusted.notification(jti: "t")), headers: [("X-Forwarded-For", "203.0.113.7")])
        #expect(try await trusted.count("SELECT count(*) FROM notifications WHERE remote_addr = '203.0.113.7'") == 1)
        await trusted.stop()
    }

    @Test("One structured log line per delivery with its outcome, jti, aud, type and latency; never an email address")
    func logging() async throws {
        let h = try await Harness.start()
        let email = "zz9plural@privaterelay.appleid.com"
        let jws = try h.notification(type: "email-disabled", email: email, jti: "log-1")
        _ = try await h.server.post(jws: jws)
        _ = try await h.server.post(jws: jws)
        _ = try await h.server.post(jws: try h.forged { $0["aud"] = .string("com.other"); $0["events"] = .string(#"{"type":"email-disabled","sub":"s","email":"\#(email)"}"#) })
        let deliveries = h.logs.all.filter { $0.contains(" delivery ") }
        #expect(deliveries.count == 3)
        #expect(deliveries[0].contains("outcome=accepted") && deliveries[0].contains("jti=log-1") && deliveries[0].contains("aud=\(Harness.aud)") && deliveries[0].contains("type=email-disabled") && deliveries[0].contains("latency_ms="))
        #expect(deliveries[1].contains("outcome=duplicate"))
        #expect(deliveries[2].contains("outcome=rejected") && deliveries[2].contains("reason=wrong_audience"))
        #expect(!h.logs.all.contains { $0.contains(email) || $0.contains("privaterelay") })
        await h.stop()
    }

    @Test("A forged-token flood leaves at most the configured rejection rows per minute; the rest are counted")
    func floodSampling() async throws {
        let h = try await Harness.start { $0.rejections.perMinute = 5 }
        let impostor = try AppleStyleSigner.generate()
        let forged = try impostor.sign(
            header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]),
            claims: AppleStyleSigner.claims(aud: Harness.aud, type: "consent-revoked", sub: "s", eventTime: Date(), issuedAt: Date()))
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<200 { group.addTask { try await h.server.post(jws: forged).status } }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 401, count: 200))
        await h.flushRejections()
        let minutes = try await h.count("SELECT count(DISTINCT date_trunc('minute', received_at)) FROM rejections")
        #expect(try await h.count("SELECT count(*) FROM rejections") <= 5 * minutes)
        #expect(try await h.count("SELECT max(c)::bigint FROM (SELECT count(*) AS c FROM rejections GROUP BY date_trunc('minute', received_at)) m") == 5)
        #expect(try await h.count("SELECT sum(recorded + sampled_out)::bigint FROM rejection_counts WHERE reason = 'bad_signature'") == 200)
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        await h.stop()
    }

    @Test("A wrong_audience rejection is replayed and recorded once the bundle IDs are fixed")
    func replayWrongAudience() async throws {
        let h = try await Harness.start()
        let jws = try h.signer.notification(aud: "com.example.forgotten", type: "consent-revoked", sub: "001.replay.1", jti: "replay-1")
        let refused = try await h.server.post(jws: jws)
        #expect(refused.json?["reason"] == .string("wrong_audience"))
        _ = try await h.server.post(jws: jws)  // Apple retries: kept once
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL") == 1)

        let store = h.server.application.store
        let stillWrong = try await RejectionReplay(
            notifications: store, rejections: h.server.application.rejectionStore, verifier: NotificationVerifier(audiences: [Harness.aud])
        ).run(reason: "wrong_audience")
        #expect(stillWrong.recorded == 0)
        #expect(stillWrong.stillRejected == ["wrong_audience": 1])

        let fixed = try await RejectionReplay(
            notifications: store, rejections: h.server.application.rejectionStore,
            verifier: NotificationVerifier(audiences: [Harness.aud, "com.example.forgotten"])
        ).run(reason: "wrong_audience")
        #expect(fixed.recorded == 1)
        let listed = try await store.list(NotificationFilter(aud: "com.example.forgotten"))
        #expect(listed.map(\.jti) == ["replay-1"])
        #expect(listed.first?.status == .pending)
        #expect(try await h.count("SELECT count(*) FROM jobs") == 1)
        let again = try await RejectionReplay(
            notifications: store, rejections: h.server.application.rejectionStore,
            verifier: NotificationVerifier(audiences: [Harness.aud, "com.example.forgotten"])
        ).run(reason: "wrong_audience")
        #expect(again == RejectionReplay.Summary())
        await h.stop()
    }

    @Test("Health: live always; ready with the database and a key set; /metrics in Prometheus text format")
    func health() async throws {
        let h = try await Harness.start()
        #expect(try await h.server.request(.GET, "/health/live").status == 200)
        let ready = try await h.server.request(.GET, "/health/ready")
        #expect(ready.status == 200)
        #expect(ready.json?["status"] == .string("ready"))
        _ = try await h.server.post(jws: try h.notification())
        let metrics = try await h.server.request(.GET, "/metrics")
        #expect(metrics.body.contains("# HELP siwa_notifications_received_total"))
        #expect(metrics.body.contains(#"siwa_notifications_received_total{outcome="accepted"} 1"#))
        await h.stop()
    }
}

@Suite("POST /apple/notifications: hostile input", .timeLimit(.minutes(10)))
struct HostileInputTests {
    @Test("An identity token for our own app is refused (400), not stored as a notification")
    func identityTokenRefused() async throws {
        let h = try await Harness.start()
        let idToken = try h.signer.sign(
            header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]),
            claims: .object([
                "iss": .string(NotificationVerifier.appleIssuer), "aud": .string(Harness.aud), "sub": .string("001.user.1"),
                "iat": .number(Date().timeIntervalSince1970.rounded(.down)), "exp": .number(Date().timeIntervalSince1970.rounded(.down) + 600),
                "email": .string("user@example.com"), "nonce_supported": .bool(true),
            ]))
        let answer = try await h.server.post(jws: idToken)
        #expect(answer.status == 400)
        #expect(try await h.count("SELECT count(*) FROM notifications") == 0)
        await h.stop()
    }

    @Test("Replaying one genuine token for another app keeps it once; identity tokens for other apps are never kept whole")
    func genuineTokenKeptOnce() async throws {
        let h = try await Harness.start()
        let other = try h.signer.notification(aud: "com.example.elsewhere", type: "consent-revoked", sub: "s", jti: "elsewhere-1")
        for _ in 0..<20 { _ = try await h.server.post(jws: other) }
        let idToken = try h.signer.sign(
            header: .object(["kid": .string(h.signer.kid), "alg": .string("RS256")]),
            claims: .object(["iss": .string(NotificationVerifier.appleIssuer), "aud": .string("com.example.elsewhere"), "sub": .string("u"),
                             "iat": .number(Date().timeIntervalSince1970.rounded(.down))]))
        for _ in 0..<20 { _ = try await h.server.post(jws: idToken) }
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL") == 1)
        await h.stop()
    }

    @Test("Another app's genuine notifications: at most N kept whole per aud per hour, the rest recorded without the token; kept ones deleted (with the body prefix and its address) after their retention")
    func otherAppTokensBounded() async throws {
        let h = try await Harness.start { $0.rejections.otherAppTokensPerHour = 2 }
        for index in 0..<4 {
            let token = try h.signer.notification(aud: "com.attacker.app", type: "email-disabled", sub: "001.other.\(index)", email: "u\(index)@privaterelay.appleid.com", jti: "other-\(index)")
            #expect(try await h.server.post(jws: token).json?["reason"] == .string("wrong_audience"))
        }
        let typo = try h.signer.notification(aud: "com.example.typo", type: "consent-revoked", sub: "001.typo.9", jti: "typo-9")
        #expect(try await h.server.post(jws: typo).status == 401)
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE aud = 'com.attacker.app'") == 4)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE aud = 'com.attacker.app' AND token IS NOT NULL") == 2)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE aud = 'com.example.typo' AND token IS NOT NULL") == 1)
        #expect(try await h.count("SELECT coalesce(sum(recorded), 0)::bigint FROM rejection_counts WHERE reason = 'wrong_audience'") == 5)

        // Kept past SIWA_OTHER_APP_TOKEN_RETENTION: the token goes, the row stays. Judged at a
        // time a week after the first was received and before a week after the next one was.
        func receivedAt(_ sql: String) async throws -> Date {
            var found: Date?
            for try await (date,) in try await h.server.client.query(PostgresQuery(unsafeSQL: sql)).decode((Date?,).self) { found = date }
            return try #require(found, "\(sql)")
        }
        let first = try await receivedAt("SELECT received_at FROM rejections WHERE jti = 'other-0'")
        let next = try await receivedAt("SELECT min(received_at) FROM rejections WHERE token IS NOT NULL AND jti <> 'other-0'")
        try #require(next.timeIntervalSince(first) > 0.000_01, "other-0 was posted first: \(first) \(next)")
        let week = Duration.seconds(7 * 86_400)
        let weekLater = first.addingTimeInterval(week.timeInterval + next.timeIntervalSince(first) / 2)
        let history = HistoryStore(client: h.server.client, logger: h.logs.logger())
        #expect(try await history.deleteKeptTokens(olderThan: week, now: weekLater) == 1)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE jti = 'other-0' AND token IS NULL AND key_jwk IS NULL AND length(body_prefix) = 0") == 1)
        #expect(try await DatabaseSearch.occurrences(of: "u0@privaterelay.appleid.com", in: h.server.client) == 0, "the body prefix held the address")
        #expect(try await DatabaseSearch.occurrences(of: "u1@privaterelay.appleid.com", in: h.server.client) > 0, "a kept token within its retention stays")
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL") == 2)
        #expect(try await history.deleteKeptTokens(olderThan: week, now: weekLater) == 0)
        #expect(try await history.deleteKeptTokens(olderThan: week, now: Date().addingTimeInterval(week.timeInterval + 1)) == 2)
        #expect(try await h.count("SELECT count(*) FROM rejections WHERE token IS NOT NULL") == 0)
        await h.stop()
    }

    @Test("A NUL character in a refused token does not block rejection records")
    func nulCharacters() async throws {
        let h = try await Harness.start()
        let header = Base64URL.encode(Data(#"{"alg":"\u0000","kid":"\u0000x"}"#.utf8))
        let payload = Base64URL.encode(Data(#"{"aud":"\u0000"}"#.utf8))
        let answer = try await h.server.request(body: AppleStyleSigner.body("\(header).\(payload).c2ln"))
        #expect(answer.status == 401)
        _ = try await h.server.request(body: "not json")
        await h.flushRejections()
        #expect(try await h.count("SELECT count(*) FROM rejections") == 2)
        await h.stop()
    }
}
