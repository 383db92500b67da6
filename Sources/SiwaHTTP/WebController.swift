import Hummingbird
import HTTPTypes
import NIOCore

/// The dashboard's static shell: open routes (its data calls need a token). A strict
/// Content-Security-Policy — scripts, styles and connections from this origin only, no inline
/// script, no framing — so a value that slipped through as markup still could not run.
package struct WebController: Sendable {
    package init() {}

    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        + "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

    package func register(on router: Router<SiwaRequestContext>) {
        router.get("/") { _, _ in Self.file(PackageResources.index_html, type: "text/html; charset=utf-8") }
        router.get("/app.js") { _, _ in Self.file(PackageResources.app_js, type: "text/javascript; charset=utf-8") }
        router.get("/app.css") { _, _ in Self.file(PackageResources.app_css, type: "text/css; charset=utf-8") }
    }

    static func file(_ bytes: [UInt8], type: String) -> Response {
        var headers: HTTPFields = [.contentType: type]
        headers[.contentSecurityPolicy] = contentSecurityPolicy
        headers[HTTPField.Name("X-Content-Type-Options")!] = "nosniff"
        headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        headers[.cacheControl] = "no-cache"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}
