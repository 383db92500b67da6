import Foundation
import Logging
import PostgresNIO
import SiwaDomain
import SiwaStore
import SiwaTestSupport
import SiwaWorkers
import Testing

/// An app transfer meets erasure and queued revocations, on a real database: a user erased
/// after `transfers start` is handed to no one, and a re-key leaves every queued revocation of
/// a kept Apple token decryptable (revoked at the stand-in for Apple over real HTTP).
@Suite("Transfers: erased users stay behind; queued revocations survive a re-key", .timeLimit(.minutes(10)))
struct TransferErasureTests {
    static let recipient = "TEAMB23456"
    static let sender = "TEAMA12345"

    @Test("a user erased after start leaves prepare, export, import and exchange; a re-keyed user's queued revocation still decrypts and reaches Apple")
    func erasedAfterStart() async throws {
        let apple = try await AppleRevocationTests.Apple.start(signer: AppleRevocationTests.signer)
        let h = try await AppleRevocationTests.harness(apple, revokeOnAppleEvents: true)
        let logger = h.h.logs.logger()
        // "move-1" has a revocation of their kept token queued (consent-revoked, revoked at Apple
        // on events), its ciphertext sealed for their sub; "erased-1" is a user with an address.
        let token = try await apple.refreshToken(sub: "move-1")
        _ = try await AppleRevocationTests.keep(token, sub: "move-1", in: h)
        try await h.client.query(
            "UPDATE apple_tokens SET updated_at = timestamptz 'epoch' + \(Int(EffectHarness.base)) * interval '1 millisecond' WHERE sub = 'move-1'")
        try await h.post("consent-revoked", sub: "move-1", at: 5_000)
        #expect(try await h.drain() == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND sub = 'move-1' AND state = 'available'") == 1)
        try await h.client.query("INSERT INTO accounts (aud, sub, email, is_private_email) VALUES (\(Harness.aud), 'erased-1', 'e1@privaterelay.appleid.com', true)")

        // The transfer is started and prepared, and this database moved with the app.
        let transfers = TransferStore(client: h.client, logger: logger)
        let outgoing = try await transfers.start(.outgoing, clientID: Harness.aud, aud: Harness.aud, teamID: Self.recipient, transferredAt: nil, actor: "test")
        #expect(try await transfers.listUsers(of: outgoing) == 2)
        try await transfers.record(.success("ts.move"), sub: "move-1", of: outgoing)
        try await transfers.record(.success("ts.erased"), sub: "erased-1", of: outgoing)
        let incoming = try await transfers.start(.incoming, clientID: Harness.aud, aud: Harness.aud, teamID: Self.sender, transferredAt: nil, actor: "test")
        #expect(try await transfers.importPrepared(into: incoming, ourTeam: Self.recipient) == 2)

        // Then the user is erased: nothing of theirs is asked for, exported or exchanged any more.
        _ = try await AccountStore(client: h.client, logger: logger).erase(aud: Harness.aud, sub: "erased-1", actor: "test")
        #expect(try await transfers.listUsers(of: outgoing) == 0)
        #expect(try await transfers.transferSubs(of: outgoing) == ["ts.move"])
        #expect(try await transfers.pendingImports(of: incoming, limit: 100) == ["ts.move"])
        #expect(try await transfers.importPrepared(into: incoming, ourTeam: Self.recipient) == 0)
        #expect(try await DatabaseSearch.occurrences(of: "ts.erased", in: h.client) == 0)
        #expect(try await h.h.count("SELECT count(*) FROM transfer_subs WHERE sub = 'erased-1'") == 0)

        // The exchange re-keys "move-1"; their queued revocation stays under the sub it is sealed
        // for, so the deliverer opens it and Apple takes it.
        #expect(try await transfers.rekey(transferSub: "ts.move", to: MigratedUser(sub: "new-move", email: nil, isPrivateEmail: nil), of: incoming))
        #expect(try await h.h.count("SELECT count(*) FROM accounts WHERE sub = 'new-move'") == 1)
        #expect(try await AppleRevocationTests.deliver(h) == 1)
        #expect(apple.revocations(of: token) == 1)
        #expect(try await h.h.count("SELECT count(*) FROM jobs WHERE lane = 'apple_revocations' AND state = 'completed' AND payload IS NULL") == 1)

        // Identifiers prepared for an erased account by an older release: an exchange neither
        // moves nor re-creates it, and an import file naming it adds nothing.
        try await h.client.query("INSERT INTO transfer_subs (transfer_id, sub, transfer_sub) VALUES (\(outgoing.id), 'erased-1', 'ts.stale')")
        try await h.client.query("INSERT INTO transfer_imports (transfer_id, transfer_sub) VALUES (\(incoming.id), 'ts.stale')")
        let revived = MigratedUser(sub: "new-erased", email: "e1@privaterelay.appleid.com", isPrivateEmail: true)
        #expect(try await transfers.rekey(transferSub: "ts.stale", to: revived, of: incoming) == false)
        #expect(try await h.h.count("SELECT count(*) FROM accounts WHERE sub = 'new-erased'") == 0)
        #expect(try await h.h.count("SELECT count(*) FROM accounts WHERE sub = 'erased-1' AND erased_at IS NOT NULL AND email IS NULL") == 1)
        #expect(try await h.h.count("SELECT count(*) FROM transfer_imports WHERE transfer_sub = 'ts.stale' AND error = 'erased'") == 1)
        let file = try await transfers.start(.incoming, clientID: Harness.aud, aud: Harness.aud, teamID: "TEAMC34567", transferredAt: nil, actor: "test")
        #expect(try await transfers.importTransferSubs(["ts.stale", "ts.fresh"], into: file) == 1)
        await h.stop()
        await apple.stop()
    }
}
