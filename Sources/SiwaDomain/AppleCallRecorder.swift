/// Whom a call to Apple concerned, for its record: the user (their timeline lists it) and the
/// job that made it. A sign-in's code exchange learns its user only from the answer: recorded
/// with none, then attributed by the sign-in's transaction.
package struct AppleCallSubject: Sendable, Equatable {
    package var aud: String?
    package var sub: String?
    package var jobID: Int?

    package init(aud: String? = nil, sub: String? = nil, jobID: Int? = nil) {
        self.aud = aud
        self.sub = sub
        self.jobID = jobID
    }

    /// No user: a migration call, a refused exchange, the revocation of an unkept token.
    package static let none = AppleCallSubject()
}

/// Where every call sent to Apple is recorded (`apple_auth_calls`): `/auth/revoke` answers 200
/// to any token, so only our own record proves what was sent. `AppleGateway` calls it once per
/// call it sends; the store conforms.
package protocol AppleCallRecorder: Sendable {
    /// Records `call`; returns the record's id.
    @discardableResult
    func record(_ call: AppleAuthRecord, about subject: AppleCallSubject) async throws -> Int
}
