/// The most rows one list answers, the same in the API (`limit`) and the CLI (`--limit`): longer
/// histories are paged (`next_cursor`) or exported (`notifications export`, NDJSON).
package enum ListLimit {
    package static let maximum = 1000
    package static let range = 1...maximum
}

extension EventType {
    /// The `type` filter values, as error messages name them (Apple's other spelling of the
    /// deletion event, `account-deleted`, is accepted too).
    package static var filterValues: String { allCases.map(\.rawValue).joined(separator: ", ") }
}
