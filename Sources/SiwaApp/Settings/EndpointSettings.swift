import Foundation
import SiwaDomain
import SiwaWorkers

extension Settings {
    package static let publicURL = Setting<URL?>.webURL(
        "SIWA_PUBLIC_URL", flag: "public-url", .alerts, shown: "none (no check)",
        help: "the URL registered with Apple: checked in the background as doctor does",
        docs: "The URL registered with Apple (e.g. `https://siwa.example.com/apple/notifications`): one process checks it every `SIWA_ENDPOINT_CHECK_INTERVAL` as `doctor` does; a failure fires `endpoint_unhealthy`. Results on the admin listener's `/health`.")
    package static let publicURLCAFile = Setting<String?>.optionalText(
        "SIWA_PUBLIC_URL_CA_FILE", flag: "public-url-ca-file", .alerts, shown: "none",
        help: "also trust this PEM CA when checking SIWA_PUBLIC_URL (staging only)",
        docs: "Also trust this PEM CA certificate when checking `SIWA_PUBLIC_URL`, like `doctor --ca-file`: for staging only, since Apple trusts only public CAs.")
    package static let endpointCheckInterval = Setting<Duration>.duration(
        "SIWA_ENDPOINT_CHECK_INTERVAL", flag: "endpoint-check-interval", .alerts, default: EndpointHealthSettings().interval, minimum: .seconds(60),
        help: "how often SIWA_PUBLIC_URL is checked (by one process)",
        docs: "How often `SIWA_PUBLIC_URL` is checked (by one process at a time).")
    package static let alertCertificateDays = Setting<Int>.integer(
        "SIWA_ALERT_CERTIFICATE_DAYS", flag: "alert-certificate-days", .alerts, default: EndpointHealthSettings().certificateDays, 1...365,
        help: "endpoint_unhealthy fires when SIWA_PUBLIC_URL's certificate expires within this many days",
        docs: "`endpoint_unhealthy` fires when the certificate of `SIWA_PUBLIC_URL` expires within this many days.")

    static let endpoint = [publicURL.info, publicURLCAFile.info, endpointCheckInterval.info, alertCertificateDays.info]
}

extension EndpointHealthSettings {
    /// The endpoint check; the CA file is read now, so a bad one stops start-up.
    package init(_ source: SettingSource) throws(ConfigurationError) {
        self.init()
        url = try source.value(Settings.publicURL)
        caFile = try source.value(Settings.publicURLCAFile)
        interval = try source.value(Settings.endpointCheckInterval)
        certificateDays = try source.value(Settings.alertCertificateDays)
        if let caFile {
            guard url != nil else {
                throw ConfigurationError(variable: Settings.publicURLCAFile.info.name, message: "is set, but SIWA_PUBLIC_URL is not: set the URL to check, or unset the CA file")
            }
            do {
                _ = try EndpointChecker.probe(self)
            } catch {
                throw ConfigurationError(variable: Settings.publicURLCAFile.info.name, message: "cannot read \(caFile) as PEM certificates: \(error)")
            }
        }
    }
}
