import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import SiwaDomain

/// What a code exchange adds to `POST /v1/sessions`: the same number of sessions opened with
/// `aud`+`sub` and with an `authorization_code` from the stand-in (exchanged at its `/auth/token`,
/// the `id_token` verified, the refresh token encrypted and kept), one at a time on one
/// connection; p50/p99 of each. Codes are fetched before the clock starts.
struct Sessions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "p50/p99 of POST /v1/sessions with aud+sub and with an authorization code.")
    @Option(help: "The server's admin base URL (the API).") var url: String
    @Option(help: "The stand-in's base URL (`siwa-events standin serve`).") var standin: String
    @Option(help: "An API token with sessions:write.") var token: String
    @Option(help: "Bundle ID (aud), also the client ID the codes are for.") var aud: String
    @Option(help: "Sessions of each kind.") var requests: Int = 2000

    func run() async throws {
        let run = UUID().uuidString.prefix(8).lowercased()
        var codes: [String] = []
        for index in 0..<requests {
            let answer = try await post(
                "\(standin)/standin/codes", body: ["client_id": .string(aud), "sub": .string("001\(index).code\(run).\(index)")], bearer: nil)
            guard answer.status == 200, let code = JSONValue.parse(Data(answer.body.utf8))?["code"]?.stringValue else {
                throw ValidationError("the stand-in answered \(answer.status) for a code: \(answer.body)")
            }
            codes.append(code)
        }
        // Warm-up: connections opened and statements prepared before either is timed.
        for index in 0..<min(100, requests) {
            _ = try await post("\(url)/v1/sessions", body: ["aud": .string(aud), "sub": .string("001.warm\(run).\(index)")], bearer: token)
        }
        var plain: [Double] = []
        for index in 0..<requests {
            let started = ContinuousClock.now
            let answer = try await post("\(url)/v1/sessions", body: ["aud": .string(aud), "sub": .string("001\(index).plain\(run).\(index)")], bearer: token)
            plain.append(milliseconds(ContinuousClock.now - started))
            guard answer.status == 201 else { throw ValidationError("POST /v1/sessions with aud+sub answered \(answer.status): \(answer.body)") }
        }
        var exchanged: [Double] = []
        for code in codes {
            let started = ContinuousClock.now
            let answer = try await post("\(url)/v1/sessions", body: ["authorization_code": .string(code)], bearer: token)
            exchanged.append(milliseconds(ContinuousClock.now - started))
            guard answer.status == 201 else { throw ValidationError("POST /v1/sessions with a code answered \(answer.status): \(answer.body)") }
        }
        report("POST /v1/sessions, aud+sub", plain)
        report("POST /v1/sessions, authorization_code (exchange at the stand-in, id_token verified, refresh token kept)", exchanged)
        let (p50, p99) = (percentile(exchanged, 0.5) - percentile(plain, 0.5), percentile(exchanged, 0.99) - percentile(plain, 0.99))
        print(String(format: "the code exchange adds: p50 +%.2fms, p99 +%.2fms", p50, p99))
    }

    private func milliseconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
    }

    private func percentile(_ values: [Double], _ p: Double) -> Double {
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.up)) - 1)]
    }

    private func report(_ label: String, _ values: [Double]) {
        print(String(format: "%@: n=%d p50=%.2fms p99=%.2fms max=%.2fms", label, values.count, percentile(values, 0.5), percentile(values, 0.99), values.max() ?? 0))
    }

    private func post(_ url: String, body: [String: JSONValue], bearer: String?) async throws -> (status: Int, body: String) {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        request.body = .bytes(ByteBuffer(string: JSONValue.object(body).jsonText))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let text = try await response.body.collect(upTo: 1 << 20)
        return (Int(response.status.code), String(buffer: text))
    }
}
