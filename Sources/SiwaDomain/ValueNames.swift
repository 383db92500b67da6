extension CaseIterable where Self: RawRepresentable, RawValue == String {
    /// Every value, comma-separated, as an error or a help text names the valid ones.
    package static var valueNames: String { allCases.map(\.rawValue).joined(separator: ", ") }
}
