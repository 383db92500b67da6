import Foundation
import Logging
import SiwaDomain
import SiwaStore

/// `rejections replay`: re-checks kept tokens with the current configuration, as of the time they
/// were received and with the key that verified them then, and records those that now pass —
/// so a genuine notification refused for a bundle-ID typo is not lost.
package struct RejectionReplay: Sendable {
    package struct Summary: Sendable, Equatable {
        package var recorded = 0
        package var duplicates = 0
        package var stillRejected: [String: Int] = [:]
        package init() {}
    }

    let notifications: NotificationStore
    let rejections: RejectionStore
    let verifier: NotificationVerifier

    package init(notifications: NotificationStore, rejections: RejectionStore, verifier: NotificationVerifier) {
        self.notifications = notifications
        self.rejections = rejections
        self.verifier = verifier
    }

    package func run(reason: String, progress: (Int, Int) -> Void = { _, _ in }) async throws -> Summary {
        let candidates = try await rejections.replayCandidates(reason: reason)
        var summary = Summary()
        for (index, candidate) in candidates.enumerated() {
            do {
                let keys = try AppleKeySet.single(jwkJSON: candidate.keyJWK)
                let verified = try verifier.verify(candidate.token, keys: keys, now: candidate.receivedAt)
                let outcome = try await notifications.record(
                    verified, rawJWS: candidate.token, receivedAt: candidate.receivedAt, remoteAddress: candidate.remoteAddress)
                switch outcome {
                case .accepted(let jti, _):
                    summary.recorded += 1
                    try await rejections.markReplayed(id: candidate.id, outcome: "recorded \(jti)", succeeded: true, at: Date())
                case .duplicate(let jti):
                    summary.duplicates += 1
                    try await rejections.markReplayed(id: candidate.id, outcome: "duplicate of \(jti)", succeeded: true, at: Date())
                }
            } catch let error as VerificationError {
                summary.stillRejected[error.reason.rawValue, default: 0] += 1
                try await rejections.markReplayed(id: candidate.id, outcome: "still \(error.reason.rawValue): \(error.message)", succeeded: false, at: Date())
            } catch let error as AppleKeySet.InvalidDocument {
                summary.stillRejected["unknown_key", default: 0] += 1
                try await rejections.markReplayed(id: candidate.id, outcome: "stored key unusable: \(error)", succeeded: false, at: Date())
            }
            progress(index + 1, candidates.count)
        }
        // No notifier loop runs in this process: running workers elsewhere hear of the jobs now.
        await notifications.jobsNotifier.runOnce()
        return summary
    }
}
