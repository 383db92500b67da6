/// A dictionary that keeps at most `limit` entries, dropping the oldest inserted first.
struct BoundedTable<Value: Sendable>: Sendable {
    private var values: [String: Value] = [:]
    /// Insertion order from `head` on; keys removed since are skipped when their turn comes.
    private var order: [String] = []
    private var head = 0
    let limit: Int

    init(limit: Int) { self.limit = max(1, limit) }

    subscript(key: String) -> Value? { values[key] }

    mutating func insert(_ key: String, _ value: Value) {
        values[key] = value
        order.append(key)
        while values.count > limit, head < order.count {
            values[order[head]] = nil
            head += 1
        }
        if head > limit || order.count - head > 2 * limit {
            order = order[head...].filter { values[$0] != nil }
            head = 0
        }
    }

    /// Replaces the value of an entry still held, keeping its place in the order.
    mutating func update(_ key: String, _ value: Value) {
        if values[key] != nil { values[key] = value }
    }

    mutating func remove(_ key: String) { values[key] = nil }
}
