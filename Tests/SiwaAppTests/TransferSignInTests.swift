import Foundation
import NIOHTTP1
import PostgresNIO
import SiwaDomain
import SiwaTestSupport
import Testing

/// Sign-in during an app transfer's window, through the API: Apple's identity token for the user's
/// new sub carries `transfer_sub`, which the sender's prepared identifiers map to the old account.
@Suite("Transfers: sign-in with transfer_sub during the window", .timeLimit(.minutes(10)))
struct TransferSignInTests {
    @Test("an identity token carrying transfer_sub opens the session on the user's account before the exchange reaches them, moving its sessions and history once")
    func signInRekeys() async throws {
        let h = try await Harness.start()
        let db = h.server.client
        // This database moved with the app: the sender prepared the user's identifier here.
        var transferID = 0
        for try await (id,) in try await db.query(
            """
            INSERT INTO transfers (direction, client_id, aud, team_id, transferred_at, created_by)
            VALUES ('outgoing', \(Harness.aud), \(Harness.aud), 'TEAMB23456', now(), 'test') RETURNING id
            """
        ).decode((Int,).self) { transferID = id }
        try await db.query("INSERT INTO transfer_subs (transfer_id, sub, transfer_sub) VALUES (\(transferID), '001.old.1', 'st1.moved-user')")
        try await db.query("INSERT INTO accounts (aud, sub, email, is_private_email) VALUES (\(Harness.aud), '001.old.1', 'old@privaterelay.appleid.com', true)")
        try await db.query("INSERT INTO sessions (aud, sub) VALUES (\(Harness.aud), '001.old.1')")
        try await db.query(
            """
            INSERT INTO notifications (jti, aud, sub, type, raw_type, event_time, status, kid, issued_at, raw_jws, header, claims)
            VALUES ('jti-old-1', \(Harness.aud), '001.old.1', 'email-disabled', 'email-disabled', now(), 'applied', 'k', now(), 'x', '{}', '{}')
            """)
        let token = try await API.token(h, [.sessionsWrite, .sessionsRead])
        let identity = try h.signer.identityToken(aud: Harness.aud, sub: "002.new.1", transferSub: "st1.moved-user")

        let opened = try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(identity)])
        #expect(opened.status == 201 && opened.json?["sub"] == .string("002.new.1"), "\(opened.status) \(opened.body)")
        #expect(try await h.count("SELECT count(*) FROM accounts WHERE sub = '001.old.1'") == 0)
        #expect(try await h.count("SELECT count(*) FROM accounts WHERE sub = '002.new.1' AND email = 'old@privaterelay.appleid.com'") == 1)
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '002.new.1'") == 2)  // the old one moved, the new one opened
        #expect(try await h.count("SELECT count(*) FROM notifications WHERE sub = '002.new.1'") == 1)
        #expect(try await h.count("SELECT count(*) FROM account_sub_changes WHERE old_sub = '001.old.1' AND new_sub = '002.new.1'") == 1)
        let sessions = try await API.call(h, .GET, "/v1/accounts/\(Harness.aud)/002.new.1/sessions", token: token)
        #expect(sessions.json?["items"]?.arrayValue?.count == 2)

        // Again: nothing left to move; another user's token with no transfer_sub moves nothing.
        #expect(try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(identity)]).status == 201)
        let stranger = try h.signer.identityToken(aud: Harness.aud, sub: "002.other.1")
        #expect(try await API.call(h, .POST, "/v1/sessions", token: token, body: ["identity_token": .string(stranger)]).status == 201)
        #expect(try await h.count("SELECT count(*) FROM account_sub_changes") == 1)
        #expect(try await h.count("SELECT count(*) FROM sessions WHERE sub = '002.new.1'") == 3)

        // GET /v1/transfers: the transfer, its progress and the window (transferred just now: 60 days left, today counted).
        #expect(try await API.call(h, .GET, "/v1/transfers", token: token).status == 403)
        let reader = try await API.token(h, [.accountsRead])
        let listed = try await API.call(h, .GET, "/v1/transfers", token: reader)
        let item = try #require(listed.json?["items"]?.arrayValue?.first, "\(listed.body)")
        #expect(item["direction"] == .string("outgoing") && item["team_id"] == .string("TEAMB23456") && item["client_id"] == .string(Harness.aud))
        #expect(item["users"] == .number(1) && item["done"] == .number(1) && item["users_left"] == .number(0), "\(listed.body)")
        #expect(item["window_open"] == .bool(true) && item["days_left"] == .number(60), "\(listed.body)")
        await h.stop()
    }
}
