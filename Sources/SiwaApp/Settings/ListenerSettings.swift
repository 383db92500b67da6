import Foundation
import NIOSSL
import SiwaDomain
import SiwaHTTP
import SiwaStore

extension Settings {
    package static let host = Setting<String>.text(
        "SIWA_HOST", flag: "host", .listeners, default: "127.0.0.1",
        help: "address to listen on",
        docs: "Address of the public listener: `POST /apple/notifications` and `/health/*`, nothing else. The only one to expose to the internet (through your TLS proxy).")
    package static let port = Setting<Int>.integer(
        "SIWA_PORT", flag: "port", .listeners, default: 8080, 0...65535,
        help: "port to listen on",
        docs: "Port of the public listener.")
    package static let adminHost = Setting<String>.text(
        "SIWA_ADMIN_HOST", flag: "admin-host", .listeners, default: "127.0.0.1",
        help: "address of the admin listener (API, dashboard, /metrics)",
        docs: "Address of the admin listener: `/v1`, the dashboard, `/openapi.yaml`, `/metrics` (and `/health/*`). Keep it on loopback or a private network (SSH tunnel, VPN, `kubectl port-forward`); never route it from the internet.")
    package static let adminHosts = Setting<[String]>(
        "SIWA_ADMIN_HOSTS", flag: "admin-hosts", .listeners, default: ["localhost"], shown: "`localhost`",
        help: "host names the admin listener answers to, besides IP addresses",
        docs: "Comma-separated host names the admin listener answers to (as `Host`), besides any IP address: a request for another name gets 421, so a web page cannot reach the admin listener through DNS rebinding. Add the names Prometheus or your tunnel use (e.g. `siwa-events-admin`)."
    ) { text throws(SettingValueError) in
        let names = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }.filter { !$0.isEmpty }
        for name in names where name.range(of: "^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$", options: .regularExpression) == nil {
            throw SettingValueError("must be comma-separated host names such as localhost,siwa-events-admin (got \"\(name)\")")
        }
        return names
    }
    package static let adminPort = Setting<Int>.integer(
        "SIWA_ADMIN_PORT", flag: "admin-port", .listeners, default: 8081, 0...65535,
        help: "port of the admin listener",
        docs: "Port of the admin listener; must differ from `SIWA_PORT`.")
    package static let httpRequestTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_REQUEST_TIMEOUT", flag: "http-request-timeout", .listeners, default: ConnectionLimits().requestTimeout, minimum: .seconds(1),
        help: "a request's head and body must arrive within this from its first byte",
        docs: "A request's head and body must arrive within this from its first byte; a slower client's connection is closed (an idle timeout alone restarts on every byte).")
    package static let httpIdleTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_IDLE_TIMEOUT", flag: "http-idle-timeout", .listeners, default: ConnectionLimits().idleTimeout, minimum: .seconds(1),
        help: "a connection without a request in progress is closed after this",
        docs: "A connection without a request in progress is closed after this. Longer than the upstream keep-alive of nginx (`keepalive_timeout` 60s) and Caddy (2m), so a proxy never reuses a connection being closed.")
    package static let httpFirstRequestTimeout = Setting<Duration>.duration(
        "SIWA_HTTP_FIRST_REQUEST_TIMEOUT", flag: "http-first-request-timeout", .listeners, default: ConnectionLimits().firstRequestTimeout,
        minimum: .seconds(1),
        help: "a new connection must start its first request within this",
        docs: "A new connection (its TLS handshake done, when serving TLS) must start its first request within this, or it is closed and counted in `siwa_connections_closed_total{reason=\"first_request_timeout\"}`: a client that connects and says nothing holds a place this long, not `SIWA_HTTP_IDLE_TIMEOUT`.")
    package static let tlsHandshakeTimeout = Setting<Duration>.duration(
        "SIWA_TLS_HANDSHAKE_TIMEOUT", flag: "tls-handshake-timeout", .listeners, default: ConnectionLimits().tlsHandshakeTimeout, minimum: .seconds(1),
        help: "a TLS handshake must complete within this (with SIWA_TLS_CERT_FILE)",
        docs: "With `SIWA_TLS_CERT_FILE`: a TLS handshake must complete within this.")
    package static let httpMaxConnections = Setting<Int>.integer(
        "SIWA_HTTP_MAX_CONNECTIONS", flag: "http-max-connections", .listeners, default: ConnectionLimits().maximumConnections, 1...1_000_000,
        help: "open connections per listener at most; one more replaces the longest-idle",
        docs: "Open connections per listener at most (about 34 KiB each). One more takes the place of the longest-idle connection (no request in progress: before its first or between requests; `siwa_connections_closed_total{reason=\"idle_evicted\"}`); only when every one has a request in progress is it closed at once (`reason=\"over_capacity\"`).")
    package static let tlsCertificateFile = Setting<String?>.optionalText(
        "SIWA_TLS_CERT_FILE", flag: "tls-cert-file", .listeners, shown: "none",
        help: "serve HTTPS: PEM certificate chain, leaf first (with SIWA_TLS_KEY_FILE)",
        docs: "Serve HTTPS (TLS 1.2+) directly: PEM certificate chain (leaf first), with `SIWA_TLS_KEY_FILE`. Without them, plain HTTP behind a TLS proxy (deploy/tls/). Certificates are read at start: restart after renewal.")
    package static let tlsKeyFile = Setting<String?>.optionalText(
        "SIWA_TLS_KEY_FILE", flag: "tls-key-file", .listeners, shown: "none",
        help: "serve HTTPS: PEM private key of the certificate",
        docs: "Serve HTTPS: the PEM private key of `SIWA_TLS_CERT_FILE`.")
    package static let trustedProxies = Setting<TrustedProxies>(
        "SIWA_TRUSTED_PROXIES", flag: "trusted-proxies", .listeners, default: .none, shown: "none",
        help: "CIDR list whose X-Forwarded-For is believed",
        docs: "CIDR list; `X-Forwarded-For` is believed only from these peers."
    ) { text throws(SettingValueError) in
        do { return try TrustedProxies(parsing: text) } catch { throw SettingValueError(String(describing: error)) }
    }
    package static let metricsToken = Setting<String?>(
        "SIWA_METRICS_TOKEN", flag: "metrics-token", .listeners, default: nil, shown: "none",
        help: "when set, /metrics needs Authorization: Bearer <it>",
        docs: "When set (16+ characters), `/metrics` (on the admin listener) also needs `Authorization: Bearer <it>`.", secret: true
    ) { token throws(SettingValueError) in
        guard token.utf8.count >= 16 else { throw SettingValueError("must be at least 16 characters (e.g. openssl rand -hex 16)") }
        return token
    }
    package static let commitQueueLimit = Setting<Int>.integer(
        "SIWA_COMMIT_QUEUE_LIMIT", flag: "commit-queue-limit", .listeners, default: GroupCommitter.defaultMaximumQueued, 1...1_000_000,
        help: "notifications waiting for a commit at most; more are answered 503 at once",
        docs: "Notifications waiting for a commit at most (each commit takes every notification waiting, up to 512). One more is answered 503 at once, so while PostgreSQL is slower than the arrivals the receiver's memory stays bounded and Apple hears \"retry\" without waiting out the timeout.")

    static let listeners = [
        host.info, port.info, adminHost.info, adminHosts.info, adminPort.info, httpRequestTimeout.info, httpIdleTimeout.info, httpFirstRequestTimeout.info,
        tlsHandshakeTimeout.info, httpMaxConnections.info, tlsCertificateFile.info, tlsKeyFile.info, trustedProxies.info, metricsToken.info,
        commitQueueLimit.info,
    ]
}

/// The two listeners: the public one (`host`, `port`) and the admin one (API, dashboard,
/// /openapi.yaml, /metrics), and what guards them.
package struct HTTPSettings: Sendable {
    package var host: String
    package var port: Int
    package var adminHost: String
    package var adminPort: Int
    package var limits: ConnectionLimits
    /// Serve HTTPS directly (PEM files: the certificate chain, leaf first, and its private key).
    /// Without them: plain HTTP behind a TLS-terminating proxy.
    package var tlsCertificateFile: String?
    package var tlsKeyFile: String?
    package var trustedProxies: TrustedProxies
    package var adminHosts: [String]
    package var metricsToken: String?
    package var commitQueueLimit: Int

    /// The admin listener must be a second one; HTTPS needs both readable files.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        host = try source.value(Settings.host)
        port = try source.value(Settings.port)
        adminHost = try source.value(Settings.adminHost)
        adminPort = try source.value(Settings.adminPort)
        if adminPort == port && port != 0 && adminHost == host {
            throw ConfigurationError(variable: Settings.adminPort.info.name, message: "must differ from SIWA_PORT (\(port)): the admin listener is a second one")
        }
        limits = try ConnectionLimits(source)
        trustedProxies = try source.value(Settings.trustedProxies)
        adminHosts = try source.value(Settings.adminHosts)
        commitQueueLimit = try source.value(Settings.commitQueueLimit)
        metricsToken = try source.value(Settings.metricsToken)
        switch (source.text(Settings.tlsCertificateFile.info), source.text(Settings.tlsKeyFile.info)) {
        case (nil, nil): break
        case (let certificate?, let key?):
            for (setting, path) in [(Settings.tlsCertificateFile, certificate), (Settings.tlsKeyFile, key)] where !FileManager.default.isReadableFile(atPath: path) {
                throw ConfigurationError(variable: setting.info.name, message: "cannot read \(path)")
            }
            tlsCertificateFile = certificate
            tlsKeyFile = key
        case (nil, _):
            throw ConfigurationError(variable: Settings.tlsCertificateFile.info.name, message: "is required with SIWA_TLS_KEY_FILE (serving HTTPS needs both)")
        case (_, nil):
            throw ConfigurationError(variable: Settings.tlsKeyFile.info.name, message: "is required with SIWA_TLS_CERT_FILE (serving HTTPS needs both)")
        }
    }

    /// HTTPS (TLS 1.2+) with SIWA_TLS_CERT_FILE / SIWA_TLS_KEY_FILE, or nil for plain HTTP.
    package func tlsConfiguration() throws -> TLSConfiguration? {
        guard let tlsCertificateFile, let tlsKeyFile else { return nil }
        let chain: [NIOSSLCertificate]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(tlsCertificateFile)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_CERT_FILE", message: "\(tlsCertificateFile) is not a PEM certificate chain (\(error))")
        }
        guard !chain.isEmpty else { throw ConfigurationError(variable: "SIWA_TLS_CERT_FILE", message: "\(tlsCertificateFile) holds no certificate") }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: tlsKeyFile, format: .pem)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_KEY_FILE", message: "\(tlsKeyFile) is not a PEM private key (\(error))")
        }
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv12
        do {
            _ = try NIOSSLContext(configuration: tls)
        } catch {
            throw ConfigurationError(variable: "SIWA_TLS_KEY_FILE", message: "the key does not fit the certificate or TLS cannot start (\(error))")
        }
        return tls
    }
}

extension ConnectionLimits {
    /// Each listener's connection guard.
    init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        requestTimeout = try source.value(Settings.httpRequestTimeout)
        idleTimeout = try source.value(Settings.httpIdleTimeout)
        firstRequestTimeout = try source.value(Settings.httpFirstRequestTimeout)
        tlsHandshakeTimeout = try source.value(Settings.tlsHandshakeTimeout)
        maximumConnections = try source.value(Settings.httpMaxConnections)
    }
}
