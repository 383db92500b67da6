import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS
import Logging
import SiwaApp
import SiwaApple
import SiwaDomain
import SiwaStore
import SiwaWorkers

/// `healthcheck`: the container's HEALTHCHECK (the runtime image has no curl). Exit 0 when the URL
/// answers 200, 1 otherwise; the answer's body is printed either way.
struct Healthcheck: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "GET a health route of a running siwa-events (exit 0 when it answers 200): the container's HEALTHCHECK.",
        discussion: """
            Examples:
              siwa-events healthcheck
              siwa-events healthcheck --url http://127.0.0.1:8080/health/live --timeout 2s
            """)

    @Option(help: "The route to ask. Default: http://127.0.0.1:$SIWA_PORT/health/ready.")
    var url: String?
    @Option(help: "How long to wait for the answer, e.g. 3s.")
    var timeout: String = "3s"

    func run() async throws {
        let port = ProcessInfo.processInfo.environment["SIWA_PORT"] ?? "8080"
        let target = url ?? "http://127.0.0.1:\(port)/health/ready"
        guard let limit = try? DurationSyntax.parse(timeout) else { throw ValidationError("--timeout: \"\(timeout)\" is not a duration such as 3s") }
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: .init(redirectConfiguration: .disallow))
        let status: HTTPResponseStatus
        do {
            let response = try await http.execute(HTTPClientRequest(url: target), timeout: .nanoseconds(Int64(limit.nanoseconds)))
            let body = try await response.body.collect(upTo: 64 * 1024)
            print(String(buffer: body))
            status = response.status
        } catch {
            try? await http.shutdown()
            printError("healthcheck: \(target): \(error)")
            throw ExitCode.failure
        }
        try? await http.shutdown()
        if status != .ok { throw ExitCode.failure }
    }
}

/// `doctor --url https://…`: checks, from where it runs, what Apple needs to deliver to the
/// endpoint: the name resolves (to a public address), TLS 1.2+ with a publicly trusted chain for
/// that name, and the route answers a malformed notification with siwa-events' 400 JSON — not a
/// 404 (wrong path or proxy), a redirect, a 5xx, or a 2xx (something that accepts anything).
struct Doctor: SettingsCommand {
    static let settingGroups: [SettingGroup] = [.database, .apple, .appleCredentials, .logging]
    static let configuration = CommandConfiguration(
        abstract: "Check an endpoint the way Apple will call it: DNS, TLS version and certificate chain, and the route.",
        discussion: """
            Prints one line per check (ok, warn, FAIL) and exits 0 when nothing failed, 1 otherwise. \
            The route check POSTs a malformed notification ({"siwa_events_doctor": …}, no payload): \
            siwa-events answers 400 JSON and records it as a rejection (reason malformed_request); nothing is accepted. \
            With DATABASE_URL (or an embedded database here) it also checks the database role: \
            connected as a superuser is a failure. With SIWA_APPLE_TEAM_ID, SIWA_APPLE_KEY_ID and \
            SIWA_APPLE_PRIVATE_KEY_FILE it checks that Apple accepts their client secret for each of \
            SIWA_APPLE_BUNDLE_IDS, with one harmless call (revoking a token that does not exist).

            Examples:
              siwa-events doctor --url https://siwa.example.com/apple/notifications
              siwa-events doctor --url https://$HOST/apple/notifications --ca-file ca.pem
            """)

    @Option(help: "The URL registered with Apple, e.g. https://siwa.example.com/apple/notifications.")
    var url: String
    @Option(name: .customLong("ca-file"), help: "Also trust this PEM CA certificate (a staging CA; Apple trusts only public CAs, so it is a warning).")
    var caFile: String?
    @Option(help: "Limit of each network check, e.g. 10s.")
    var timeout: String = "10s"

    func run(_ settings: SettingSource) async throws {
        guard var probe = try? EndpointProbe(url: url) else {
            throw ValidationError("--url: \"\(url)\" is not an https:// URL such as https://siwa.example.com/apple/notifications")
        }
        guard let limit = try? DurationSyntax.parse(timeout) else { throw ValidationError("--timeout: \"\(timeout)\" is not a duration such as 10s") }
        probe.timeout = limit
        if let caFile {
            do {
                try probe.trust(caFile: caFile)
            } catch {
                throw ValidationError("--ca-file: cannot read \(caFile) as PEM certificates: \(error)")
            }
        }
        var report = DoctorReport()
        // URL, DNS, TLS and the route: the checks the background endpoint check runs too.
        for finding in await probe.check(now: Date()).findings {
            switch finding.level {
            case .ok: report.ok(finding.check.rawValue, finding.detail)
            case .warn: report.warn(finding.check.rawValue, finding.detail)
            case .fail: report.fail(finding.check.rawValue, finding.detail)
            }
        }

        await checkDatabase(&report, settings)
        await checkAppleCredentials(&report, settings, timeout: limit)

        for line in report.lines { print(line) }
        if report.failed {
            printError("doctor: \(report.failures) check(s) failed")
            throw ExitCode.failure
        }
    }

    /// The credentials for Apple's auth endpoints: a revoke of a token that does not exist is
    /// answered 200 when Apple accepts the client secret, `invalid_client` when it does not.
    func checkAppleCredentials(_ report: inout DoctorReport, _ settings: SettingSource, timeout: Duration) async {
        let credentials: AppleCredentials?
        let clientIDs: [String]
        do {
            credentials = try AppleCredentials.configured(settings)
            clientIDs = try settings.value(Settings.bundleIDs)
        } catch {
            report.fail("apple-credentials", error.description)
            return
        }
        guard let credentials else { return }
        guard !clientIDs.isEmpty else {
            report.fail("apple-credentials", "set SIWA_APPLE_BUNDLE_IDS: the client secret is checked for each bundle ID")
            return
        }
        let client = credentials.client(timeout: timeout)
        for clientID in clientIDs.prefix(5) {
            let call = await client.revoke(token: "siwa-events-doctor-\(UUID().uuidString)", hint: .accessToken, clientID: clientID)
            let who = "team \(credentials.policy.teamID), key \(credentials.key.keyID), client \(clientID)"
            switch call.result {
            case .success:
                report.ok("apple-credentials", "\(credentials.authURL.absoluteString) accepted the client secret (\(who))")
            case .failure(.apple(.invalidClient)):
                report.fail(
                    "apple-credentials",
                    "Apple refused the client secret (invalid_client; \(who)): check the team ID, the key ID, that the .p8 is that key's, and that the key is enabled for Sign in with Apple on \(clientID)'s primary App ID")
            case .failure(let failure):
                report.fail("apple-credentials", "\(failure) (\(who))")
            }
        }
    }

    /// The database the service would use: reachable, and not as a superuser.
    func checkDatabase(_ report: inout DoctorReport, _ settings: SettingSource) async {
        let database: DatabaseSettings
        do {
            database = try DatabaseSettings(settings)
        } catch {
            printError("siwa-events: \(error.description)")
            report.fail("database", "the database settings are invalid (see above)")
            return
        }
        let logger = (try? makeLogger(settings)) ?? Logger(label: "siwa-events")
        do {
            let role = try await Database.with(database, logger: logger) { database in
                (
                    try await ConnectedRole.read(database.client, logger: logger), database.description,
                    try? await JobQueue(client: database.client, logger: logger).appleRevocationBacklog()
                )
            }
            if let url = database.url, let warning = DatabaseURL.transportWarning(url) { report.warn("database", warning) }
            if let problem = role.0.superuserProblem {
                report.fail("database", "\(role.1): \(problem)")
            } else {
                report.ok("database", "\(role.1): connected as \(role.0.name), not a superuser")
            }
            if let backlog = role.2 { Self.checkRevocations(&report, backlog) }
        } catch let error as ConfigurationError where database.url == nil {
            report.warn("database", "not checked: \(error.description)")
        } catch {
            report.fail("database", "\(error)")
        }
    }
}

extension Doctor {
    /// Revocations of kept Apple tokens Apple has not taken: a discarded one holds a token that
    /// stays unrevoked until an operator retries it.
    static func checkRevocations(_ report: inout DoctorReport, _ backlog: JobQueue.AppleRevocationBacklog) {
        let waiting = "\(backlog.waiting) revocation\(backlog.waiting == 1 ? "" : "s") of kept Apple tokens waiting"
        if backlog.discarded > 0 {
            report.warn(
                "apple-revocations",
                "\(waiting), \(backlog.discarded) discarded after their last attempt: their tokens stay unrevoked; "
                    + "see `siwa-events apple revocations --failed`, then `siwa-events apple retry --discarded`")
        } else {
            report.ok("apple-revocations", "\(waiting), none discarded")
        }
    }
}

/// The doctor's findings, one line each.
struct DoctorReport {
    private(set) var lines: [String] = []
    private(set) var failures = 0
    var failed: Bool { failures > 0 }

    mutating func ok(_ check: String, _ text: String) { lines.append("ok    \(check): \(text)") }
    mutating func warn(_ check: String, _ text: String) { lines.append("warn  \(check): \(text)") }
    mutating func fail(_ check: String, _ text: String) {
        failures += 1
        lines.append("FAIL  \(check): \(text)")
    }
}


extension Duration {
    fileprivate var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
