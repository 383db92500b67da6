import Foundation

/// Splits a migration file into statements. postgres-nio speaks only the extended query protocol,
/// which takes one statement at a time, so the file is split on top-level semicolons — outside
/// `--` and `/* */` comments, quoted strings and identifiers, and `$tag$` dollar-quoted bodies.
package enum SQLStatements {
    package static func split(_ sql: String) -> [String] {
        var scanner = Scanner(sql: sql)
        scanner.run()
        return scanner.statements
    }

    /// One pass over a file; `current` collects the statement being read.
    private struct Scanner {
        let sql: String
        var index: String.Index
        var current = ""
        var statements: [String] = []

        init(sql: String) {
            self.sql = sql
            self.index = sql.startIndex
        }

        mutating func run() {
            while index < sql.endIndex {
                let character = sql[index]
                if character == "-" && peek() == "-" {
                    skipLineComment()
                } else if character == "/" && peek() == "*" {
                    skipBlockComment()
                } else if character == "'" || character == "\"" {
                    copyQuoted(character)
                } else if character == "$", let tag = dollarTag() {
                    copyDollarQuoted(tag)
                } else if character == ";" {
                    endStatement()
                    advance()
                } else {
                    current.append(character)
                    advance()
                }
            }
            endStatement()
        }

        /// The character after the current one.
        func peek() -> Character? {
            sql.index(index, offsetBy: 1, limitedBy: sql.endIndex).flatMap { $0 < sql.endIndex ? sql[$0] : nil }
        }

        mutating func advance(by count: Int = 1) { index = sql.index(index, offsetBy: count) }

        mutating func endStatement() {
            let statement = current.trimmingCharacters(in: .whitespacesAndNewlines)
            if !statement.isEmpty { statements.append(statement) }
            current = ""
        }

        /// `-- …` up to the end of the line (the newline is kept).
        mutating func skipLineComment() {
            while index < sql.endIndex && sql[index] != "\n" { advance() }
        }

        /// `/* … */`, nested ones included; it stands as one space.
        mutating func skipBlockComment() {
            var depth = 0
            repeat {
                if sql[index] == "/" && peek() == "*" {
                    depth += 1
                    advance(by: 2)
                } else if sql[index] == "*" && peek() == "/" {
                    depth -= 1
                    advance(by: 2)
                } else {
                    advance()
                }
            } while depth > 0 && index < sql.endIndex
            current.append(" ")
        }

        /// A string or quoted identifier, a doubled quote inside it included, copied whole.
        mutating func copyQuoted(_ quote: Character) {
            current.append(quote)
            advance()
            while index < sql.endIndex {
                current.append(sql[index])
                if sql[index] == quote {
                    guard peek() == quote else { break }
                    advance()
                    current.append(sql[index])
                }
                advance()
            }
            if index < sql.endIndex { advance() }
        }

        /// The `$tag$` that opens a dollar-quoted body here, if one does.
        func dollarTag() -> String? {
            let afterDollar = sql.index(after: index)
            guard let close = sql[afterDollar...].firstIndex(of: "$"),
                sql[afterDollar..<close].allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" })
            else { return nil }
            return String(sql[index...close])
        }

        /// A dollar-quoted body, both tags included, copied whole (to the end if unclosed).
        mutating func copyDollarQuoted(_ tag: String) {
            let bodyStart = sql.index(index, offsetBy: tag.count)
            let end = sql[bodyStart...].range(of: tag)?.upperBound ?? sql.endIndex
            current += sql[index..<end]
            index = end
        }
    }
}
