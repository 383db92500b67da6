import Hummingbird
import NIOCore

/// The OpenAPI document of the whole HTTP API (`Sources/SiwaHTTP/openapi.yaml`, built in).
package enum OpenAPIDocument {
    package static var bytes: [UInt8] { PackageResources.openapi_yaml }
}

/// `GET /openapi.yaml`: the API's contract, open (it holds no data).
package struct OpenAPIController: Sendable {
    package init() {}

    package func register(on router: Router<SiwaRequestContext>) {
        router.get("/openapi.yaml") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/yaml; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: OpenAPIDocument.bytes)))
        }
    }
}
