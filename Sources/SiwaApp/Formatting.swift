import Foundation
import SiwaDomain
import SiwaRuntime
import SiwaStore

extension NotificationSummary {
    /// The `--json` line of `notifications list`.
    package var json: JSONValue {
        var object: [String: JSONValue] = [
            "jti": .string(jti), "aud": .string(aud), "received_at": .string(iso8601(receivedAt)),
            "status": .string(status.rawValue), "deliveries": .number(Double(deliveries)),
            "type": type.map(JSONValue.string) ?? .null, "raw_type": rawType.map(JSONValue.string) ?? .null,
            "sub": sub.map(JSONValue.string) ?? .null, "event_time": eventTime.map { .string(iso8601($0)) } ?? .null,
        ]
        object["skip_reason"] = skipReason.map(JSONValue.string) ?? .null
        return .object(object)
    }
}

extension AppleEvent {
    package var json: JSONValue {
        var object: [String: JSONValue] = [
            "type": type.map { .string($0.rawValue) } ?? .null, "raw_type": .string(rawType), "sub": .string(sub),
            "event_time": .string(iso8601(eventTime)), "event_time_ms": .number(Double(eventTimeMillis)),
        ]
        if let email { object["email"] = .string(email) }
        if let isPrivateEmail { object["is_private_email"] = .bool(isPrivateEmail) }
        return .object(object)
    }
}

/// A plain text table for terminals. Cells hold stored text (some of it from requests nobody
/// verified), so control characters are printed escaped (`\n`, `\u{1b}`): no cell can move the
/// cursor, recolour the terminal or fake a row.
package func table(_ header: [String], _ rows: [[String]]) -> String {
    let rows = rows.map { $0.map(terminalSafe) }
    var widths = header.map(\.count)
    for row in rows {
        for (index, cell) in row.enumerated() where index < widths.count { widths[index] = max(widths[index], cell.count) }
    }
    func line(_ cells: [String]) -> String {
        cells.enumerated().map { index, cell in
            index == cells.count - 1 ? cell : cell.padding(toLength: widths[index], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }
    return ([line(header)] + rows.map(line)).joined(separator: "\n")
}

/// `text` with control characters escaped as `\n`, `\r`, `\t` or `\u{…}` (as in log lines).
package func terminalSafe(_ text: String) -> String {
    var escaped = ""
    LineLogHandler.appendEscaped(text, to: &escaped, quotes: false)
    return escaped
}

/// Text these commands did not write, as printed: another team's export (its client ID), what
/// Apple answered (a refusal's word, why a run stopped), what the database holds of either. Cut to
/// `limit` bytes (`UntrustedText`) and its control characters escaped (`terminalSafe`), so a file
/// cannot retitle or clear the operator's terminal, move its cursor or fake a line.
package func printable(_ text: String, limit: Int = 128) -> String {
    terminalSafe(UntrustedText.bounded(text, limit: limit))
}
