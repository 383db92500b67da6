import Foundation

/// ISO-8601 UTC with milliseconds: the one timestamp format of every output (API, CLI, callbacks).
package func iso8601(_ date: Date) -> String {
    date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
}

/// The same for a time in milliseconds since the epoch (Apple's event_time).
package func iso8601(millis: Int64) -> String {
    iso8601(Date(timeIntervalSince1970: Double(millis) / 1000))
}

/// An RFC 3339 `date-time` (what the API's documents declare): `YYYY-MM-DDTHH:MM:SS[.fraction]`
/// then `Z` or `±HH:MM`, any year from 0000 to 9999 and any offset; nil for anything else.
package func rfc3339(_ text: String) -> Date? {
    let bytes = Array(text.utf8)
    func number(_ range: Range<Int>) -> Int? {
        guard range.upperBound <= bytes.count else { return nil }
        var value = 0
        for byte in bytes[range] {
            guard (0x30...0x39).contains(byte) else { return nil }
            value = value * 10 + Int(byte - 0x30)
        }
        return value
    }
    func byte(_ index: Int, _ expected: Character...) -> Bool {
        index < bytes.count && expected.contains { $0.asciiValue == bytes[index] }
    }
    guard let year = number(0..<4), byte(4, "-"), let month = number(5..<7), byte(7, "-"), let day = number(8..<10), byte(10, "T", "t", " "),
        let hour = number(11..<13), byte(13, ":"), let minute = number(14..<16), byte(16, ":"), let second = number(17..<19),
        (1...12).contains(month), hour < 24, minute < 60, second <= 60
    else { return nil }
    let daysInMonth = [31, year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    guard (1...daysInMonth[month - 1]).contains(day) else { return nil }
    var index = 19
    var fraction = 0.0
    if byte(index, ".") {
        var scale = 0.1
        index += 1
        let start = index
        while index < bytes.count, (0x30...0x39).contains(bytes[index]) {
            fraction += Double(bytes[index] - 0x30) * scale
            scale /= 10
            index += 1
        }
        guard index > start else { return nil }
    }
    var offset = 0
    if byte(index, "Z", "z") {
        index += 1
    } else if byte(index, "+", "-") {
        guard let hours = number(index + 1..<index + 3), byte(index + 3, ":"), let minutes = number(index + 4..<index + 6), hours < 24, minutes < 60
        else { return nil }
        offset = (hours * 60 + minutes) * 60 * (bytes[index] == UInt8(ascii: "-") ? -1 : 1)
        index += 6
    } else {
        return nil
    }
    guard index == bytes.count else { return nil }
    // Days from 1970-01-01 to the civil date (Howard Hinnant's days_from_civil).
    let y = month <= 2 ? year - 1 : year
    let era = (y >= 0 ? y : y - 399) / 400
    let yearOfEra = y - era * 400
    let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
    let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
    let days = era * 146_097 + dayOfEra - 719_468
    let seconds = Double(days * 86_400 + hour * 3600 + minute * 60 + min(second, 59) - offset) + fraction
    return Date(timeIntervalSince1970: seconds)
}
