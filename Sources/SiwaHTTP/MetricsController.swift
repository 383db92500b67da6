import Hummingbird
import NIOCore
import Prometheus

/// `GET /metrics`: every metric in Prometheus's text format, behind `Authorization: Bearer
/// <SIWA_METRICS_TOKEN>` when that is set. `beforeScrape` sets the gauges read at scrape time.
package struct MetricsController: Sendable {
    let registry: PrometheusCollectorRegistry
    let token: String?
    let beforeScrape: @Sendable () -> Void

    package init(registry: PrometheusCollectorRegistry, token: String?, beforeScrape: @escaping @Sendable () -> Void) {
        self.registry = registry
        self.token = token
        self.beforeScrape = beforeScrape
    }

    package func register(on router: Router<SiwaRequestContext>) {
        let (registry, token, beforeScrape) = (self.registry, self.token, self.beforeScrape)
        router.get("/metrics") { request, _ in
            if let token {
                let given = request.headers[.authorization].map { Array($0.utf8) } ?? []
                guard constantTimeEqual(given, Array("Bearer \(token)".utf8)) else {
                    throw APIError(.unauthorized, code: "unauthorized", message: "/metrics needs Authorization: Bearer <SIWA_METRICS_TOKEN>")
                }
            }
            beforeScrape()
            var buffer: [UInt8] = []
            registry.emit(into: &buffer)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
    }
}

/// Compares without an early exit, so the time taken says nothing about where they differ.
package func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    var difference: UInt8 = 0
    for index in a.indices { difference |= a[index] ^ b[index] }
    return difference == 0
}
