import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Prometheus
import SiwaApple
import SiwaDomain
import SiwaStore

/// `POST /apple/notifications`: accepts exactly the genuine notifications and answers 200 only
/// after the notification (and its job) is durably committed.
package struct NotificationsController: Sendable {
    package static let path: RouterPath = "/apple/notifications"
    /// Apple's bodies are ~1-2 KiB; anything past 64 KiB is refused before it is read.
    package static let maximumBodySize = 64 * 1024
    /// How much of a refused body is kept for diagnosis.
    static let recordedPrefix = 512

    let verifier: NotificationVerifier
    let keys: AppleKeyCache
    let committer: GroupCommitter
    let rejections: RejectionRecorder
    let metrics: ReceiverMetrics
    let trustedProxies: TrustedProxies
    let logger: Logger

    package init(
        verifier: NotificationVerifier, keys: AppleKeyCache, committer: GroupCommitter, rejections: RejectionRecorder,
        metrics: ReceiverMetrics, trustedProxies: TrustedProxies, logger: Logger
    ) {
        self.verifier = verifier
        self.keys = keys
        self.committer = committer
        self.rejections = rejections
        self.metrics = metrics
        self.trustedProxies = trustedProxies
        self.logger = logger
    }

    package func register(on router: Router<SiwaRequestContext>) {
        router.post(Self.path) { request, context in try await receive(request, context: context) }
        for method: HTTPRequest.Method in [.get, .put, .patch, .delete, .head] {
            router.on(Self.path, method: method) { _, _ -> Response in
                throw APIError(
                    .methodNotAllowed, code: "method_not_allowed",
                    message: "\(method.rawValue) is not supported here; Apple POSTs notifications to this URL",
                    headers: [.allow: "POST"])
            }
        }
    }

    /// What happened to one delivery, for its answer, its log line and its metrics.
    private enum Outcome {
        case stored(RecordOutcome, VerifiedNotification)
        case rejected(APIError, RejectionRecord)
        case unavailable(APIError, String)
        /// Verified, but not storable as it is (`NotificationRefused`).
        case refused(APIError, String)
    }

    func receive(_ request: Request, context: SiwaRequestContext) async throws -> Response {
        let started = ContinuousClock.now
        let receivedAt = Date()
        // Every X-Forwarded-For line counts: a proxy may append its own line after the client's.
        let forwarded = request.headers[values: .xForwardedFor]
        let remote = trustedProxies.clientAddress(peer: context.peerAddress, forwardedFor: forwarded.isEmpty ? nil : forwarded.joined(separator: ","))
        let outcome = await handle(request, receivedAt: receivedAt, remote: remote)
        let elapsed = ContinuousClock.now - started
        metrics.duration.recordNanoseconds(elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000)
        var metadata: Logger.Metadata = ["latency_ms": "\(Double(elapsed.components.attoseconds / 1_000_000_000_000) / 1000 + Double(elapsed.components.seconds) * 1000)"]
        if let remote { metadata["remote_addr"] = "\(remote)" }
        switch outcome {
        case .stored(let recorded, let notification):
            metadata["jti"] = "\(notification.jti)"
            metadata["aud"] = "\(notification.aud)"
            metadata["type"] = "\(notification.decoding.event.map { $0.type?.rawValue ?? $0.rawType } ?? "-")"
            switch recorded {
            case .accepted(let jti, let status):
                metadata["outcome"] = "accepted"
                metadata["status"] = "\(status.rawValue)"
                if case .skipped(let reason, let detail, _) = notification.decoding {
                    metadata["skip_reason"] = "\(reason.rawValue)"
                    metadata["skip_detail"] = "\(detail)"
                    metrics.count(skipped: reason)
                }
                metrics.count(outcome: "accepted")
                metrics.count(accepted: notification.aud, type: notification.decoding.event?.type)
                logger.info("delivery", metadata: metadata)
                return .json(.object(["status": .string("accepted"), "id": .string(jti)]))
            case .duplicate(let jti):
                metadata["outcome"] = "duplicate"
                metadata["stored_jti"] = "\(jti)"
                metrics.count(outcome: "duplicate")
                logger.info("delivery", metadata: metadata)
                return .json(.object(["status": .string("duplicate"), "id": .string(jti)]))
            }
        case .rejected(let error, let record):
            rejections.record(record)
            metadata["outcome"] = "rejected"
            metadata["reason"] = "\(record.reason.rawValue)"
            if let jti = record.jti { metadata["jti"] = "\(jti)" }
            if let aud = record.aud { metadata["aud"] = "\(aud)" }
            if let kid = record.kid { metadata["kid"] = "\(kid)" }
            metrics.count(outcome: "rejected")
            logger.info("delivery", metadata: metadata)
            throw error
        case .refused(let error, let detail), .unavailable(let error, let detail):
            let word = if case .refused = outcome { "refused" } else { "unavailable" }
            metadata["outcome"] = "\(word)"
            metadata["error"] = "\(detail)"
            metrics.count(outcome: word)
            logger.warning("delivery", metadata: metadata)
            throw error
        }
    }

    private func handle(_ request: Request, receivedAt: Date, remote: String?) async -> Outcome {
        func rejected(_ error: VerificationError, body: ByteBuffer?, size: Int, kid: String? = nil, jws: CompactJWS? = nil, keepWith key: AppleKey? = nil) -> Outcome {
            let claims = jws.flatMap { JSONValue.parse($0.payload) }
            let jti = claims?["jti"]?.stringValue ?? jws.map { NotificationVerifier.derivedID(payloadSegment: $0.payloadSegment) }
            let record = RejectionRecord(
                receivedAt: receivedAt, remoteAddress: remote, reason: error.reason, message: error.message, bodySize: size,
                bodyPrefix: body.map { Array($0.readableBytesView.prefix(Self.recordedPrefix)) } ?? [],
                kid: kid, aud: claims?["aud"].map(Self.audienceText), jti: jti,
                sub: claims.flatMap { EventDecoding.subject(of: $0["events"]) },
                token: key == nil ? nil : jws?.raw, keyJWK: key?.jwkJSON)
            return .rejected(.from(error), record)
        }
        if let length = request.headers[.contentLength].flatMap(Int.init), length > Self.maximumBodySize {
            return tooLarge(size: length, receivedAt: receivedAt, remote: remote)
        }
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: Self.maximumBodySize)
        } catch {
            return tooLarge(size: Self.maximumBodySize + 1, receivedAt: receivedAt, remote: remote)
        }
        let size = body.readableBytes
        guard let json = JSONValue.parse(body.readableBytesView), json.objectValue != nil else {
            return rejected(.malformed("the body is not JSON; Apple sends {\"payload\": \"<JWS>\"}"), body: body, size: size)
        }
        guard let payload = json["payload"]?.stringValue else {
            return rejected(.malformed("the body has no string field \"payload\"; Apple sends {\"payload\": \"<JWS>\"}"), body: body, size: size)
        }
        let jws: CompactJWS
        let kid: String
        do {
            jws = try CompactJWS(payload)
            kid = try NotificationVerifier.checkHeader(jws)
        } catch {
            return rejected(error, body: body, size: size, kid: (try? CompactJWS(payload))?.kid)
        }
        let key: AppleKey
        switch await keys.resolve(kid: kid) {
        case .key(let resolved):
            key = resolved
        case .unknown(let kid, _):
            return rejected(.invalid(.unknownKey, "no Apple key with kid \(UntrustedText.bounded(kid)), even after refreshing Apple's key set"), body: body, size: size, kid: kid)
        case .unavailable(let retryAfter, let why):
            // The detail (source URL, fetch error) goes to the log, not to an unauthenticated caller.
            return .unavailable(.unavailable("the signing key of this notification cannot be checked right now; retry later", retryAfter: retryAfter), why)
        }
        let notification: VerifiedNotification
        let verifying = ContinuousClock.now
        do {
            notification = try verifier.verify(jws, key: key, now: receivedAt)
            metrics.verification.record(ContinuousClock.now - verifying)
        } catch {
            // A wrong_audience token passed the signature check: it is Apple's. When it is a
            // notification (it has `events`; identity tokens don't), keep it whole so it can be
            // replayed once SIWA_APPLE_BUNDLE_IDS is fixed.
            let keep = error.reason == .wrongAudience && JSONValue.parse(jws.payload)?["events"] != nil
            return rejected(error, body: body, size: size, kid: kid, jws: jws, keepWith: keep ? key : nil)
        }
        do {
            let committer = self.committer
            let incoming = NotificationStore.Incoming(notification: notification, rawJWS: jws.raw, receivedAt: receivedAt, remoteAddress: remote)
            let committing = ContinuousClock.now
            let outcome = try await committer.record(incoming)  // by the database timeout at the latest
            metrics.durable.record(ContinuousClock.now - committing)
            return .stored(outcome, notification)
        } catch let refused as NotificationRefused {
            // Signed, but PostgreSQL will never store it as it is: a retry would fail the same way.
            let code = refused.sqlState.map { " (SQLSTATE \($0))" } ?? ""
            return .refused(
                APIError(
                    .unprocessableContent, code: "unstorable_notification",
                    message: "the notification is signed, but the database refused to store its content\(code); a retry would be refused the same way"),
                refused.description)
        } catch let full as CommitQueueFull {
            // The limit is for the log (and the operator), not for an unauthenticated caller.
            return .unavailable(
                .unavailable("the receiver is at capacity (too many notifications waiting for the database); retry later", retryAfter: .seconds(5)),
                "\(full.description); SIWA_COMMIT_QUEUE_LIMIT sets the limit")
        } catch {
            return .unavailable(
                .unavailable("the notification could not be recorded (database unavailable); retry later", retryAfter: .seconds(5)),
                loggable(error))
        }
    }

    private func tooLarge(size: Int, receivedAt: Date, remote: String?) -> Outcome {
        let message = "the body is larger than \(Self.maximumBodySize) bytes; Apple's notifications are a few KiB"
        let record = RejectionRecord(
            receivedAt: receivedAt, remoteAddress: remote, reason: .payloadTooLarge, message: message, bodySize: size, bodyPrefix: [])
        return .rejected(APIError(.contentTooLarge, code: "payload_too_large", message: message), record)
    }

    private static func audienceText(_ value: JSONValue) -> String {
        switch value {
        case .string(let text): text
        case .array(let values): values.compactMap(\.stringValue).joined(separator: ",")
        default: value.jsonText
        }
    }
}

extension HTTPField.Name {
    static let xForwardedFor = Self("X-Forwarded-For")!
}
