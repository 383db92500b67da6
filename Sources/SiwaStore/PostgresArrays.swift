import NIOCore
import PostgresNIO

/// A one-dimensional array parameter whose elements may be NULL, in PostgreSQL's binary array
/// format (postgres-nio encodes `[T]` but not `[T?]`). Batches travel as one array per column and
/// are expanded with `unnest(...)`: one bind per column whatever the batch size, no text to escape
/// or parse on either side, and one statement text, so it can be prepared once per connection.
package struct NullableArray<Element: PostgresArrayEncodable & PostgresNonThrowingEncodable>: PostgresNonThrowingEncodable, Sendable
where Element: Sendable {
    package var elements: [Element?]

    package init(_ elements: [Element?]) { self.elements = elements }

    package static var psqlType: PostgresDataType { Element.psqlArrayType }
    package static var psqlFormat: PostgresFormat { .binary }

    package func encode<JSONEncoder: PostgresJSONEncoder>(into buffer: inout ByteBuffer, context: PostgresEncodingContext<JSONEncoder>) {
        // Header: number of dimensions, has-nulls flag, element type; then length and lower bound.
        buffer.writeInteger(elements.isEmpty ? 0 : 1, as: Int32.self)
        buffer.writeInteger(elements.contains { $0 == nil } ? 1 : 0, as: Int32.self)
        buffer.writeInteger(Element.psqlType.rawValue)
        guard !elements.isEmpty else { return }
        buffer.writeInteger(Int32(elements.count))
        buffer.writeInteger(1, as: Int32.self)
        for element in elements {
            if let element {
                // Each element: its length, then its binary value.
                let lengthIndex = buffer.writerIndex
                buffer.writeInteger(0, as: Int32.self)
                let start = buffer.writerIndex
                element.encode(into: &buffer, context: context)
                buffer.setInteger(Int32(buffer.writerIndex - start), at: lengthIndex)
            } else {
                buffer.writeInteger(-1, as: Int32.self)
            }
        }
    }
}
