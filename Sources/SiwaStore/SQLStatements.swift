import Foundation

/// Splits a migration file into statements. postgres-nio speaks only the extended query protocol,
/// which takes one statement at a time, so the file is split on top-level semicolons — outside
/// `--` and `/* */` comments, quoted strings and identifiers, and `$tag$` dollar-quoted bodies.
package enum SQLStatements {
    package static func split(_ sql: String) -> [String] {
        var statements: [String] = []
        var current = ""
        var index = sql.startIndex
        func peek(_ offset: Int = 1) -> Character? {
            sql.index(index, offsetBy: offset, limitedBy: sql.endIndex).flatMap { $0 < sql.endIndex ? sql[$0] : nil }
        }
        while index < sql.endIndex {
            let character = sql[index]
            if character == "-" && peek() == "-" {
                while index < sql.endIndex && sql[index] != "\n" { index = sql.index(after: index) }
                continue
            }
            if character == "/" && peek() == "*" {
                var depth = 0
                repeat {
                    if sql[index] == "/" && peek() == "*" { depth += 1; index = sql.index(index, offsetBy: 2); continue }
                    if sql[index] == "*" && peek() == "/" { depth -= 1; index = sql.index(index, offsetBy: 2); continue }
                    index = sql.index(after: index)
                } while depth > 0 && index < sql.endIndex
                current.append(" ")
                continue
            }
            if character == "'" || character == "\"" {
                current.append(character)
                index = sql.index(after: index)
                while index < sql.endIndex {
                    current.append(sql[index])
                    if sql[index] == character {
                        if peek() == character {
                            index = sql.index(after: index)
                            current.append(sql[index])
                        } else {
                            break
                        }
                    }
                    index = sql.index(after: index)
                }
                if index < sql.endIndex { index = sql.index(after: index) }
                continue
            }
            if character == "$", let close = sql[sql.index(after: index)...].firstIndex(of: "$"),
                sql[sql.index(after: index)..<close].allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" })
            {
                let tag = String(sql[index...close])
                let bodyStart = sql.index(after: close)
                let end = sql[bodyStart...].range(of: tag)?.upperBound ?? sql.endIndex
                current += sql[index..<end]
                index = end
                continue
            }
            if character == ";" {
                let statement = current.trimmingCharacters(in: .whitespacesAndNewlines)
                if !statement.isEmpty { statements.append(statement) }
                current = ""
                index = sql.index(after: index)
                continue
            }
            current.append(character)
            index = sql.index(after: index)
        }
        let statement = current.trimmingCharacters(in: .whitespacesAndNewlines)
        if !statement.isEmpty { statements.append(statement) }
        return statements
    }
}

