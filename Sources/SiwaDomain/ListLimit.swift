/// The most rows one list answers, the same in the API (`limit`) and the CLI (`--limit`): longer
/// histories are paged (`next_cursor`) or exported (`notifications export`, NDJSON).
package enum ListLimit {
    package static let maximum = 1000
    package static let range = 1...maximum
}
