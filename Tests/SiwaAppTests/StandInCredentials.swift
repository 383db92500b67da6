import Crypto
import Foundation
import Logging
import SiwaApp
import SiwaAppleStandIn
import SiwaDomain
import SiwaTestSupport
import Synchronization
import Testing

/// A clock that runs with real time plus an offset a test moves: the stand-in's codes expire by
/// it, while the server's client secrets (minted at real time) stay acceptable.
final class OffsetClock: Sendable {
    private let offset = Mutex<TimeInterval>(0)
    var now: Date { Date().addingTimeInterval(offset.withLock { $0 }) }
    func advance(by seconds: TimeInterval) { offset.withLock { $0 += seconds } }
}

/// The stand-in for Apple's auth endpoints in process (over real HTTP), team TEAMID1234 with key
/// KEYID12345, and Apple credentials for a server, set as a user sets them (team ID, key ID, `.p8`
/// file, auth URL, token keys), pointing at it.
struct StandInCredentials {
    let standIn: AppleAuthStandIn
    let task: Task<Void, any Error>
    let clock: OffsetClock
    let credentials: AppleCredentials
    let directory: URL

    /// `signer` signs the id_tokens (the server must trust its key); `serverKey` is the key the
    /// credentials' `.p8` holds (default: the team's own; another is refused as Apple refuses it).
    static func start(signer: AppleStyleSigner, clientIDs: Set<String>, serverKey: P256.Signing.PrivateKey? = nil) async throws -> StandInCredentials {
        let secrets = TestClientSecrets(teamID: "TEAMID1234", keyID: "KEYID12345")
        let clock = OffsetClock()
        var configuration = AppleAuthStandIn.Configuration(
            teams: [StandInTeam(teamID: secrets.teamID, keys: [secrets.keyID: secrets.key.publicKey], clientIDs: clientIDs)], signer: signer)
        configuration.now = { clock.now }
        let standIn = AppleAuthStandIn(configuration, logger: Logger(label: "standin", factory: { _ in SwiftLogNoOpLogHandler() }))
        let task = Task { try await standIn.run() }
        let directory = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("standin-credentials-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let keyFile = directory.appendingPathComponent("AuthKey_\(secrets.keyID).p8")
        try (serverKey ?? secrets.key).pemRepresentation.write(to: keyFile, atomically: true, encoding: .utf8)
        let credentials = try #require(
            try AppleCredentials.configured(
                SettingSource(environment: [
                    "SIWA_APPLE_TEAM_ID": secrets.teamID, "SIWA_APPLE_KEY_ID": secrets.keyID, "SIWA_APPLE_PRIVATE_KEY_FILE": keyFile.path,
                    "SIWA_APPLE_AUTH_URL": try await standIn.url.absoluteString, "SIWA_APPLE_TOKEN_KEYS": AppleTokenCipher.generateKey(),
                ])))
        return StandInCredentials(standIn: standIn, task: task, clock: clock, credentials: credentials, directory: directory)
    }

    func stop() async {
        task.cancel()
        _ = await task.result
        try? FileManager.default.removeItem(at: directory)
    }
}
