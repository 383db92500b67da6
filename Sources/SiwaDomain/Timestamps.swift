import Foundation

/// ISO-8601 UTC with milliseconds: the one timestamp format of every output (API, CLI, callbacks).
package func iso8601(_ date: Date) -> String {
    date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
}

/// The same for a time in milliseconds since the epoch (Apple's event_time).
package func iso8601(millis: Int64) -> String {
    iso8601(Date(timeIntervalSince1970: Double(millis) / 1000))
}
