import ArgumentParser
import SiwaDomain

/// The flags list commands share, checked as the API checks its parameters: a bad value is a
/// usage error naming the flag and the valid values.
enum ListFlags {
    static let limitHelp = ArgumentHelp("At most this many (1-\(ListLimit.maximum), the API's maximum too).")

    static func checkLimit(_ limit: Int) throws {
        guard ListLimit.range.contains(limit) else {
            throw ValidationError("--limit must be between 1 and \(ListLimit.maximum) (got \(limit)); `notifications export` writes every row")
        }
    }

    static func checkTypes(_ types: [String]) throws {
        if let bad = types.first(where: { EventType(apple: $0) == nil }) {
            throw ValidationError("--type must be one of \(EventType.valueNames) (got \"\(bad)\")")
        }
    }

    static func checkStatuses(_ statuses: [String]) throws {
        if let bad = statuses.first(where: { ProcessingStatus(rawValue: $0) == nil }) {
            throw ValidationError("--status must be one of \(ProcessingStatus.valueNames) (got \"\(bad)\")")
        }
    }

    static func checkReason(_ reason: String?) throws {
        if let reason, RejectionReason(rawValue: reason) == nil {
            throw ValidationError("--reason must be one of \(RejectionReason.valueNames) (got \"\(reason)\")")
        }
    }

    /// Canonical type names (Apple's `account-deleted` is `account-delete`).
    static func canonical(_ types: [String]) -> [String] { types.map { EventType(apple: $0)?.rawValue ?? $0 } }
}
