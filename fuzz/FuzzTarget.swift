// libFuzzer's entry point, compiled by scripts/fuzz together with the Foundation-only parser files
// of Sources/SiwaDomain (as module SiwaDomain); not a SwiftPM target, so `swift build` never sees
// it. The work is FuzzHarness.run, the function the suite replays the corpus through; a broken
// property traps here so that libFuzzer writes the input to fuzz/crashes/.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    // libFuzzer's own buffer, exactly `size` bytes long: AddressSanitizer sees a read past its end.
    if let broken = FuzzHarness.run(UnsafeRawBufferPointer(start: data, count: size)) {
        fatalError("broken property: \(broken)")
    }
    return 0
}
