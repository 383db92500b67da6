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

    /// Ends a delivery at the stage that decided it (a rejection, a 503): each stage below either
    /// returns what the next one needs or throws the delivery's outcome.
    private struct Stop: Error {
        var outcome: Outcome
    }

    /// What a rejection records of the delivery it ends.
    private struct Delivery {
        var receivedAt: Date
        var remote: String?
        var body: ByteBuffer
        var size: Int { body.readableBytes }

        func rejected(_ error: VerificationError, kid: String? = nil, jws: CompactJWS? = nil, keepWith key: AppleKey? = nil) -> Stop {
            let claims = jws.flatMap { JSONValue.parse($0.payload) }
            let jti = claims?["jti"]?.stringValue ?? jws.map { NotificationVerifier.derivedID(payloadSegment: $0.payloadSegment) }
            let record = RejectionRecord(
                receivedAt: receivedAt, remoteAddress: remote, reason: error.reason, message: error.message, bodySize: size,
                bodyPrefix: Array(body.readableBytesView.prefix(NotificationsController.recordedPrefix)),
                kid: kid, aud: claims?["aud"].map(NotificationsController.audienceText), jti: jti,
                sub: claims.flatMap { EventDecoding.subject(of: $0["events"]) },
                token: key == nil ? nil : jws?.raw, keyJWK: key?.jwkJSON)
            return Stop(outcome: .rejected(.from(error), record))
        }
    }

    private func handle(_ request: Request, receivedAt: Date, remote: String?) async -> Outcome {
        do throws(Stop) {
            let delivery = Delivery(receivedAt: receivedAt, remote: remote, body: try await readBody(request, receivedAt: receivedAt, remote: remote))
            let (jws, kid) = try Self.parse(delivery)
            let key = try await resolveKey(kid, delivery)
            let notification = try verify(jws, key: key, kid: kid, delivery)
            return await commit(notification, rawJWS: jws.raw, receivedAt: receivedAt, remote: remote)
        } catch {
            return error.outcome
        }
    }

    /// The body, up to the size limit (a declared or actual larger one is rejected unread).
    private func readBody(_ request: Request, receivedAt: Date, remote: String?) async throws(Stop) -> ByteBuffer {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > Self.maximumBodySize {
            throw Stop(outcome: tooLarge(size: length, receivedAt: receivedAt, remote: remote))
        }
        do {
            return try await request.body.collect(upTo: Self.maximumBodySize)
        } catch {
            throw Stop(outcome: tooLarge(size: Self.maximumBodySize + 1, receivedAt: receivedAt, remote: remote))
        }
    }

    /// `{"payload": "<JWS>"}`: the compact JWS and the `kid` of its checked header.
    private static func parse(_ delivery: Delivery) throws(Stop) -> (CompactJWS, String) {
        guard let json = JSONValue.parse(delivery.body.readableBytesView), json.objectValue != nil else {
            throw delivery.rejected(.malformed("the body is not JSON; Apple sends {\"payload\": \"<JWS>\"}"))
        }
        guard let payload = json["payload"]?.stringValue else {
            throw delivery.rejected(.malformed("the body has no string field \"payload\"; Apple sends {\"payload\": \"<JWS>\"}"))
        }
        do {
            let jws = try CompactJWS(payload)
            return (jws, try NotificationVerifier.checkHeader(jws))
        } catch {
            throw delivery.rejected(error, kid: (try? CompactJWS(payload))?.kid)
        }
    }

    /// Apple's key for `kid`, from the cache or a refetch; an unknown kid is a rejection, an
    /// unreachable key set a 503.
    private func resolveKey(_ kid: String, _ delivery: Delivery) async throws(Stop) -> AppleKey {
        switch await keys.resolve(kid: kid) {
        case .key(let resolved):
            return resolved
        case .unknown(let kid, _):
            throw delivery.rejected(.invalid(.unknownKey, "no Apple key with kid \(UntrustedText.bounded(kid)), even after refreshing Apple's key set"), kid: kid)
        case .unavailable(let retryAfter, let why):
            // The detail (source URL, fetch error) goes to the log, not to an unauthenticated caller.
            throw Stop(outcome: .unavailable(.unavailable("the signing key of this notification cannot be checked right now; retry later", retryAfter: retryAfter), why))
        }
    }

    private func verify(_ jws: CompactJWS, key: AppleKey, kid: String, _ delivery: Delivery) throws(Stop) -> VerifiedNotification {
        let verifying = ContinuousClock.now
        do {
            let notification = try verifier.verify(jws, key: key, now: delivery.receivedAt)
            metrics.verification.record(ContinuousClock.now - verifying)
            return notification
        } catch {
            // A wrong_audience token passed the signature check: it is Apple's. When it is a
            // notification (it has `events`; identity tokens don't), keep it whole so it can be
            // replayed once SIWA_APPLE_BUNDLE_IDS is fixed.
            let keep = error.reason == .wrongAudience && JSONValue.parse(jws.payload)?["events"] != nil
            throw delivery.rejected(error, kid: kid, jws: jws, keepWith: keep ? key : nil)
        }
    }

    /// Records the verified notification durably (group commit) before any answer.
    private func commit(_ notification: VerifiedNotification, rawJWS: String, receivedAt: Date, remote: String?) async -> Outcome {
        do {
            let incoming = NotificationStore.Incoming(notification: notification, rawJWS: rawJWS, receivedAt: receivedAt, remoteAddress: remote)
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

    fileprivate static func audienceText(_ value: JSONValue) -> String {
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
