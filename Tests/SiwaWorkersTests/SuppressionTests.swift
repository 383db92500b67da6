import AsyncHTTPClient
import Foundation
import NIOHTTP1
import PostgresNIO
import SiwaApp
import SiwaAppleStandIn
import SiwaDomain
import SiwaRuntime
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Synchronization
import Testing

/// The suppression lanes end to end: a notification posted over real HTTP, its effect applied on
/// a real database, each provider's lane delivered by hand (`runOnce`) to the stand-in, which
/// checks every request against the provider's documented shape.
@Suite("Suppressions: email-disabled reaches each mail provider, in order, and nothing is lost", .timeLimit(.minutes(10)))
struct SuppressionTests {
    static let address = "x7mq2b@privaterelay.appleid.com"
    /// The stand-in's credentials (docs/reference.md, "Suppressions").
    static let credentials = (
        postmark: "standin-postmark-token", sendgrid: "standin-sendgrid-key", mailgun: "standin-mailgun-key", mailgunDomain: "mg.example.com",
        resend: "standin-resend-key", awsKeyID: "AKIDSTANDIN", awsSecret: "standin/secret/access/key"
    )

    static func providers(_ base: URL, _ targets: [SuppressionTarget] = SuppressionTarget.allCases, apps: Set<String> = [Harness.aud]) -> MailProviders {
        let c = credentials
        return MailProviders(
            providers: targets.map { target in
                let account: MailProviderAccount =
                    switch target {
                    case .postmark: .postmark(token: c.postmark, stream: "outbound")
                    case .sendgrid: .sendgrid(apiKey: c.sendgrid)
                    case .mailgun: .mailgun(apiKey: c.mailgun, domain: c.mailgunDomain)
                    case .resend: .resend(apiKey: c.resend)
                    case .ses: .ses(AWSSignatureV4(accessKeyID: c.awsKeyID, secretAccessKey: c.awsSecret, region: "us-east-1", service: "ses"))
                    }
                return MailProviders.Provider(account: account, baseURL: base.appendingPathComponent(target.rawValue))
            }, apps: apps)
    }

    struct Setup {
        let apple: AppleRevocationTests.Apple
        let e: EffectHarness
        let base: URL

        static func start(
            _ targets: [SuppressionTarget] = SuppressionTarget.allCases, apps: Set<String> = [Harness.aud], effectWorkers: Int = 1, batchSize: Int = 400
        ) async throws -> Setup {
            let apple = try await AppleRevocationTests.Apple.start(signer: AppleRevocationTests.signer)
            let base = try await apple.service.url
            let mail = targets.isEmpty ? nil : SuppressionTests.providers(base, targets, apps: apps)
            let e = try await EffectHarness.start(
                { configuration in
                    configuration.lanes.mail = mail
                    configuration.effects.workers = effectWorkers
                    configuration.effects.batchSize = batchSize
                    configuration.queue.backoff = RetryBackoff(base: .zero, cap: .zero)  // a retry is due at once
                },
                server: { $0.workers.lanes.mail = mail })
            return Setup(apple: apple, e: e, base: base)
        }

        /// One round of `target`'s deliverer; how many it claimed.
        @discardableResult
        func deliver(_ target: SuppressionTarget) async throws -> Int {
            try await #require(e.workers.deliverer(.suppressions(target))).runOnce(http: .shared).claimed
        }

        /// What the stand-in holds (`GET /standin/mail`): each provider's list and the requests.
        func standIn() async throws -> (suppressed: [String: [String]], requests: [JSONValue]) {
            let response = try await HTTPClient.shared.get(url: base.appendingPathComponent("standin/mail").absoluteString).get()
            let body = try #require(response.body)
            let json = try #require(JSONValue.parse(body.readableBytesView))
            let lists = (json["suppressed"]?.objectValue ?? [:]).mapValues { $0.arrayValue?.compactMap(\.stringValue) ?? [] }
            return (lists, json["requests"]?.arrayValue ?? [])
        }

        func requests(_ target: SuppressionTarget) async throws -> [JSONValue] {
            try await standIn().requests.filter { $0["provider"]?.stringValue == target.rawValue }
        }

        func stop() async {
            await e.stop()
            await apple.stop()
        }
    }

    /// The documented request of each provider (method, path below its base, headers, JSON body).
    static func expected(_ target: SuppressionTarget, _ action: SuppressionAction) -> (method: String, path: String, headers: [String: String], body: JSONValue?) {
        let a = address
        let encoded = "x7mq2b%40privaterelay.appleid.com"
        let c = credentials
        let json = ["content-type": "application/json", "accept": "application/json"]
        switch (target, action) {
        case (.postmark, _):
            return (
                "POST", "/postmark/message-streams/outbound/suppressions" + (action == .lift ? "/delete" : ""), json.merging(["x-postmark-server-token": c.postmark]) { $1 },
                .object(["Suppressions": .array([.object(["EmailAddress": .string(a)])])])
            )
        case (.sendgrid, .suppress):
            return ("POST", "/sendgrid/v3/asm/suppressions/global", json.merging(["authorization": "Bearer \(c.sendgrid)"]) { $1 }, .object(["recipient_emails": .array([.string(a)])]))
        case (.sendgrid, .lift):
            return ("DELETE", "/sendgrid/v3/asm/suppressions/global/\(encoded)", ["authorization": "Bearer \(c.sendgrid)"], nil)
        case (.mailgun, _):
            let auth = "Basic " + Data("api:\(c.mailgun)".utf8).base64EncodedString()
            return action == .suppress
                ? ("POST", "/mailgun/v3/mg.example.com/bounces", json.merging(["authorization": auth]) { $1 }, nil)
                : ("DELETE", "/mailgun/v3/mg.example.com/bounces/\(encoded)", ["authorization": auth], nil)
        case (.resend, .suppress):
            return ("POST", "/resend/suppressions", json.merging(["authorization": "Bearer \(c.resend)"]) { $1 }, .object(["email": .string(a)]))
        case (.resend, .lift):
            return ("DELETE", "/resend/suppressions/\(encoded)", ["authorization": "Bearer \(c.resend)"], nil)
        case (.ses, .suppress):
            return ("PUT", "/ses/v2/email/suppression/addresses", json, .object(["EmailAddress": .string(a), "Reason": .string("BOUNCE")]))
        case (.ses, .lift):
            return ("DELETE", "/ses/v2/email/suppression/addresses/\(encoded)", [:], nil)
        }
    }

    static func check(_ request: JSONValue, is expected: (method: String, path: String, headers: [String: String], body: JSONValue?), _ target: SuppressionTarget) {
        #expect(request["method"]?.stringValue == expected.method, "\(target)")
        #expect(request["path"]?.stringValue == expected.path, "\(target)")
        #expect(request["refused"] == .null, "\(target): the stand-in refused it: \(request["refused"]?.stringValue ?? "")")
        let headers = request["headers"]?.objectValue ?? [:]
        for (name, value) in expected.headers { #expect(headers[name]?.stringValue == value, "\(target): header \(name)") }
        if let body = expected.body { #expect(JSONValue.parse(Array((request["body"]?.stringValue ?? "").utf8)) == body, "\(target): body") }
        if target == .ses {
            let auth = headers["authorization"]?.stringValue ?? ""
            #expect(auth.hasPrefix("AWS4-HMAC-SHA256 Credential=AKIDSTANDIN/") && auth.contains("/us-east-1/ses/aws4_request, SignedHeaders="), "\(auth)")
        }
        if target == .mailgun, expected.method == "POST" {
            let list = JSONValue.parse(Array((request["body"]?.stringValue ?? "").utf8))?.arrayValue ?? []
            #expect(list.count == 1 && list.first?["address"]?.stringValue == address && list.first?["code"]?.stringValue == "550")
        }
    }

    @Test("email-disabled suppresses the address at each of the five providers with its documented request; a newer email-enabled lifts it; the feed has both")
    func eachProvider() async throws {
        let s = try await Setup.start()
        try await s.e.post("email-disabled", sub: "sup-1", at: 1_000, email: Self.address)
        try await s.e.drain()
        for target in SuppressionTarget.allCases { #expect(try await s.deliver(target) == 1, "\(target)") }
        let after = try await s.standIn()
        for target in SuppressionTarget.allCases {
            #expect(after.suppressed[target.rawValue] == [Self.address], "\(target)")
            let requests = try await s.requests(target)
            #expect(requests.count == 1)
            if let first = requests.first { Self.check(first, is: Self.expected(target, .suppress), target) }
        }
        try await s.e.post("email-enabled", sub: "sup-1", at: 2_000, email: Self.address)
        try await s.e.drain()
        for target in SuppressionTarget.allCases { #expect(try await s.deliver(target) == 1, "\(target)") }
        let lifted = try await s.standIn()
        for target in SuppressionTarget.allCases {
            #expect(lifted.suppressed[target.rawValue] ?? [] == [], "\(target)")
            let requests = try await s.requests(target)
            #expect(requests.count == 2)
            if requests.count == 2 { Self.check(requests[1], is: Self.expected(target, .lift), target) }
        }
        #expect(try await s.e.h.count("SELECT count(*) FROM suppression_changes") == 2)
        // The user's timeline shows both changes and each provider's operations.
        let timeline = try await API.call(s.e.h, .GET, "/v1/accounts/\(Harness.aud)/sup-1/timeline", token: try await API.token(s.e.h, [.admin]))
        #expect(timeline.json?["suppressions"]?.arrayValue?.compactMap { $0["action"]?.stringValue } == ["suppress", "lift"], "\(timeline.body)")
        #expect(timeline.json?["suppression_operations"]?.arrayValue?.count == 10)
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane LIKE 'suppressions_%' AND state = 'completed'") == 10)
        // The address never reached a log line.
        #expect(!s.e.h.logs.all.joined(separator: "\n").contains("x7mq2b"))
        await s.stop()
    }

    @Test("a provider failing (503) loses nothing and catches up in order: an address's later operation never overtakes an earlier one")
    func failingProviderCatchesUpInOrder() async throws {
        let s = try await Setup.start([.postmark])
        let failures = try await HTTPClient.shared.execute(
            request: try .init(
                url: s.base.appendingPathComponent("standin/mail/failures").absoluteString, method: .POST,
                headers: ["content-type": "application/json"], body: .string(#"{"provider": "postmark", "status": 503, "count": 3}"#))
        ).get()
        #expect(failures.status == .noContent)
        // Three changes, each its own batch: suppress, lift, suppress.
        for (type, at) in [("email-disabled", 1_000), ("email-enabled", 2_000), ("email-disabled", 3_000)] {
            try await s.e.post(type, sub: "sup-2", at: Int64(at), email: Self.address)
            try await s.e.drain()
        }
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'") == 3)
        // After the first failure, the provider is failing: the alert fires once it has lasted 10 min.
        #expect(try await s.deliver(.postmark) == 1)
        let queue = JobQueue(client: s.e.client, logger: s.e.h.logs.logger())
        let rule = SuppressionTargetRule(threshold: .seconds(600), resolveAfter: .seconds(300))
        let later = Date().addingTimeInterval(660)
        let failing = try await queue.suppressionsFailing(since: .distantPast, now: later)
        #expect(failing.keys.map(\.rawValue) == ["postmark"])
        let decisions = rule.step(failing, open: [], now: later)
        guard case .fire(let episode)? = decisions.first else { Issue.record("no alert: \(decisions)"); return }
        #expect(episode.key.type == "postmark")
        #expect(rule.subject(AlertMessage(id: 1, episode: episode, window: .seconds(300), resolvedAt: nil)).contains("suppressions list --target postmark --failed"))
        #expect(rule.step(try await queue.suppressionsFailing(since: .distantPast, now: Date()), open: [], now: Date()).allSatisfy { $0 == .none })
        // The admin /health, which the dashboard's "Mail providers" card reads, shows it failing.
        let health = try await s.e.h.server.request(.GET, "/health", headers: [])
        let lane = try #require(health.json?["suppressions"]?.arrayValue?.first, "\(health.body)")
        #expect(lane["target"]?.stringValue == "postmark" && lane["retrying"]?.numberValue == 1 && lane["pending"]?.numberValue == 3, "\(health.body)")
        #expect(lane["last_error"]?.stringValue?.hasPrefix("HTTP 503") == true, "\(health.body)")
        var rounds = 1
        while try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark' AND state <> 'completed'") > 0 {
            // One at a time: the claim takes only the address's oldest open job.
            #expect(try await s.deliver(.postmark) == 1)
            rounds += 1
            try #require(rounds < 20)
        }
        #expect(rounds == 6)  // three failures, then the three operations
        let requests = try await s.requests(.postmark)
        #expect(requests.map { $0["status"]?.numberValue } == [503, 503, 503, 200, 200, 200])
        #expect(requests.suffix(3).map { $0["path"]?.stringValue?.hasSuffix("/delete") } == [false, true, false])
        #expect(try await s.standIn().suppressed["postmark"] == [Self.address])
        #expect(try await queue.suppressionsFailing(since: Date(), now: Date()).isEmpty, "caught up: no longer failing")
        // The failures' words were kept, attempt by attempt.
        #expect(try await s.e.h.count("SELECT count(*) FROM job_attempts WHERE lane = 'suppressions_postmark' AND outcome = 'retrying' AND error LIKE 'HTTP 503%'") == 3)
        await s.stop()
    }

    @Test("a 429's Retry-After is kept: the operation is not tried again before it")
    func retryAfter() async throws {
        let s = try await Setup.start([.resend])
        _ = try await HTTPClient.shared.execute(
            request: try .init(
                url: s.base.appendingPathComponent("standin/mail/failures").absoluteString, method: .POST,
                headers: ["content-type": "application/json"], body: .string(#"{"provider": "resend", "status": 429, "count": 1, "retry_after": 120}"#))
        ).get()
        try await s.e.post("email-disabled", sub: "sup-3", at: 1_000, email: Self.address)
        try await s.e.drain()
        #expect(try await s.deliver(.resend) == 1)
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane = 'suppressions_resend' AND state = 'retryable' AND run_at > now() + interval '100 seconds' AND last_error LIKE 'HTTP 429%'") == 1)
        #expect(try await s.deliver(.resend) == 0)
        await s.stop()
    }

    @Test("a lift of an address the provider does not hold is done (404 where the provider answers it)")
    func liftNotHeld() async throws {
        let s = try await Setup.start([.mailgun, .resend, .ses])
        for target in [SuppressionTarget.mailgun, .resend, .ses] {
            try await s.e.client.query(
                "INSERT INTO jobs (lane, kind, aud, sub, target, payload, run_at) VALUES (\(Lane.suppressions(target).rawValue), 'lift', \(Harness.aud), 'sup-4', \(Self.address), 'email_enabled', now())")
            #expect(try await s.deliver(target) == 1)
            #expect(try await s.requests(target).map { $0["status"]?.numberValue } == [404])
        }
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane LIKE 'suppressions_%' AND state = 'completed'") == 3)
        await s.stop()
    }

    @Test("an address of an app not in SIWA_APPLE_BUNDLE_IDS is never sent: its job is discarded with the reason")
    func otherAppNeverSent() async throws {
        let s = try await Setup.start([.postmark])
        try await s.e.client.query(
            "INSERT INTO jobs (lane, kind, aud, sub, target, payload, run_at) VALUES ('suppressions_postmark', 'suppress', 'com.example.other', 's', \(Self.address), 'email_disabled', now())")
        #expect(try await s.deliver(.postmark) == 1)
        #expect(try await s.requests(.postmark).isEmpty)
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE state = 'discarded' AND last_error LIKE '%not in SIWA_APPLE_BUNDLE_IDS%'") == 1)
        await s.stop()
    }

    @Test("the feed over HTTP: suppressions:read, oldest first, pages by cursor, next_cursor never null; another app's is empty; bad input is a 400 naming the parameter")
    func feedAPI() async throws {
        let s = try await Setup.start([])
        for (type, at, sub) in [("email-disabled", 1_000, "f1"), ("email-disabled", 2_000, "f2"), ("email-enabled", 3_000, "f1"), ("email-enabled", 4_000, "f1")] {
            try await s.e.post(type, sub: sub, at: Int64(at), email: "\(sub)@privaterelay.appleid.com")
            try await s.e.drain()
        }
        let token = try await API.token(s.e.h, [.suppressionsRead])
        var cursor = "0"
        var seen: [String] = []
        for _ in 0..<5 {
            let page = try await API.call(s.e.h, .GET, "/v1/suppressions?after=\(cursor)&limit=2", token: token)
            #expect(page.status == 200)
            let items = page.json?["items"]?.arrayValue ?? []
            seen += items.map { "\($0["action"]?.stringValue ?? "")/\($0["address"]?.stringValue ?? "")/\($0["reason"]?.stringValue ?? "")" }
            let next = try #require(page.json?["next_cursor"]?.stringValue, "next_cursor is never null")
            if items.isEmpty { #expect(next == cursor) }
            cursor = next
        }
        // The fourth event changed nothing: three changes, in order.
        #expect(seen == ["suppress/f1@privaterelay.appleid.com/email_disabled", "suppress/f2@privaterelay.appleid.com/email_disabled", "lift/f1@privaterelay.appleid.com/email_enabled"])
        let one = try await API.call(s.e.h, .GET, "/v1/suppressions?aud=\(Harness.aud)&limit=1", token: token)
        #expect(one.json?["items"]?.arrayValue?.count == 1)
        let denied = try await API.call(s.e.h, .GET, "/v1/suppressions", token: try await API.token(s.e.h, [.notificationsRead]))
        #expect(denied.status == 403)
        let other = try await API.call(s.e.h, .GET, "/v1/suppressions?aud=com.example.other&after=2", token: token)
        #expect(other.status == 200 && other.json?["items"]?.arrayValue?.isEmpty == true && other.json?["next_cursor"] == .string("2"), "\(other.body)")
        for (query, word) in [("after=abc", "after"), ("after=-1", "after"), ("limit=0", "limit")] {
            let bad = try await API.call(s.e.h, .GET, "/v1/suppressions?\(query)", token: token)
            #expect(bad.status == 400, "\(query)")
            #expect(bad.body.contains(word), "\(query): \(bad.body)")
        }
        await s.stop()
    }

    @Test("the feed's cursor never skips or repeats a change while four workers commit changes concurrently")
    func cursorUnderConcurrentWriters() async throws {
        let s = try await Setup.start([], effectWorkers: 4, batchSize: 3)
        let users = 120
        for n in 0..<users {
            try await s.e.post(n % 3 == 2 ? "email-enabled" : "email-disabled", sub: "c\(n)", at: Int64(1_000 + n), email: "c\(n)@privaterelay.appleid.com")
        }
        let store = SuppressionStore(client: s.e.client, logger: s.e.h.logs.logger())
        let finished = Flag()
        #expect(s.e.workers.effects.count == 4)
        let writing = Task {
            await withTaskGroup(of: Void.self) { group in
                for worker in s.e.workers.effects {
                    group.addTask { while ((try? await worker.runOnce().claimed) ?? 0) > 0 {} }
                }
            }
            finished.set()
        }
        var cursor = 0
        var read: [Int] = []
        var done = false
        while !done {
            done = finished.isSet
            let page = try await store.changes(apps: [Harness.aud], after: cursor, limit: 7)
            read += page.map(\.cursor)
            cursor = page.last?.cursor ?? cursor
            if page.isEmpty && done { break }
            if page.isEmpty { await Task.yield() }
        }
        await writing.value
        while true {
            let page = try await store.changes(apps: [Harness.aud], after: cursor, limit: 50)
            guard let last = page.last else { break }
            read += page.map(\.cursor)
            cursor = last.cursor
        }
        var all: [Int] = []
        for try await (id,) in try await s.e.client.query("SELECT id FROM suppression_changes ORDER BY id").decode((Int,).self) { all.append(id) }
        #expect(all.count == users - users / 3)  // each email-enabled was for an address never suppressed: no change
        #expect(read == all, "read \(read.count) of \(all.count); skipped \(Set(all).subtracting(read).sorted().prefix(5))")
        await s.stop()
    }

    @Test("a change committed after a later one is not skipped: a writer waits for the feed until the one before it commits")
    func cursorWaitsForAnEarlierCommit() async throws {
        let s = try await Setup.start([])
        let store = SuppressionStore(client: s.e.client, logger: s.e.h.logs.logger())
        let logger = s.e.h.logs.logger()
        func change(_ n: Int) -> ([SuppressionKey: SuppressionState], [SuppressionChange]) {
            let key = SuppressionKey(aud: Harness.aud, address: "w\(n)@privaterelay.appleid.com")
            return ([key: SuppressionState(sub: "w\(n)", suppressed: true, reason: .emailDisabled, eventTime: Int64(n))],
                    [SuppressionChange(key: key, sub: "w\(n)", action: .suppress, reason: .emailDisabled, eventTime: Int64(n))])
        }
        let (taken, takenIn) = AsyncStream<Void>.makeStream()
        let (release, releaseIn) = AsyncStream<Void>.makeStream()
        // A: takes its feed id, then holds its transaction open.
        let first = Task {
            try await s.e.client.withTransaction(logger: logger) { connection in
                let (states, changes) = change(1)
                try await SuppressionStore.write(states, changes: changes, targets: [], on: connection, logger: logger)
                takenIn.yield()
                for await _ in release { break }
            }
        }
        for await _ in taken { break }
        // B: a later change, while A is still open.
        let second = Task {
            try await s.e.client.withTransaction(logger: logger) { connection in
                let (states, changes) = change(2)
                try await SuppressionStore.write(states, changes: changes, targets: [], on: connection, logger: logger)
            }
        }
        // Until B has committed, or waits for a lock (bounded: either comes at once).
        try await withDeadline(.seconds(60)) {
            while try await s.e.h.count("SELECT count(*) FROM suppression_changes") == 0,
                try await s.e.h.count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") == 0 {}
        }
        var read = try await store.changes(apps: [Harness.aud], after: 0, limit: 10).map(\.cursor)
        releaseIn.yield()
        try await first.value
        try await second.value
        read += try await store.changes(apps: [Harness.aud], after: read.last ?? 0, limit: 10).map(\.cursor)
        #expect(read.count == 2, "a reader resuming from its cursor read \(read)")
        #expect(read == read.sorted())
        await s.stop()
    }

    @Test("two deliverers (two processes) on one provider, many addresses: each address's operations reach the provider in event order, the last one's state wins")
    func orderUnderConcurrentDeliverers() async throws {
        let s = try await Setup.start([.postmark])
        let addresses = (0..<6).map { "c\($0)q@privaterelay.appleid.com" }
        // Each address: disabled, enabled, disabled, enabled, each its own batch.
        for step in 0..<4 {
            for (n, address) in addresses.enumerated() {
                try await s.e.post(step % 2 == 0 ? "email-disabled" : "email-enabled", sub: "o\(n)", at: Int64(1_000 * (step + 1) + n), email: address)
            }
            try await s.e.drain()
        }
        #expect(try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark'") == 24)
        let first = try #require(s.e.workers.deliverer(.suppressions(.postmark)))
        let second = Deliverer(
            lane: first.lane, worker: "other-process/suppressions_postmark", configuration: .init(lease: .seconds(30), pollInterval: .milliseconds(100)),
            queue: JobQueue(client: s.e.client, logger: s.e.h.logs.logger()), logger: s.e.h.logs.logger())
        var rounds = 0
        while try await s.e.h.count("SELECT count(*) FROM jobs WHERE lane = 'suppressions_postmark' AND state <> 'completed'") > 0 {
            async let a = first.runOnce(http: .shared)
            async let b = second.runOnce(http: .shared)
            _ = try await (a.claimed, b.claimed)
            rounds += 1
            try #require(rounds < 50)
        }
        let requests = try await s.requests(.postmark)
        for address in addresses {
            let mine = requests.filter { ($0["body"]?.stringValue ?? "").contains(address) }
            #expect(mine.map { $0["path"]?.stringValue?.hasSuffix("/delete") == true } == [false, true, false, true], "\(address)")
        }
        #expect(try await s.standIn().suppressed["postmark"] ?? [] == [])
        await s.stop()
    }
}

/// Set once, read from any task.
final class Flag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}
