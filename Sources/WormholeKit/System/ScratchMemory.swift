import Synchronization

/// Memory for reading a small file whole, reused from call to call instead of allocated per call.
///
/// A mailbox file holding a small message is 1,088 bytes: past the 1 KiB that `withUnsafeTemporaryAllocation` puts
/// on the stack on Linux, so every pass and every read allocated its buffer (an aligned `malloc`, the dearest kind:
/// about 450 instructions with its `free`, `valgrind --tool=callgrind`). Two buffers are kept, so that a pass and a
/// read on two threads both find one; a third caller at the same moment allocates, as before.
enum ScratchMemory {
    /// The size of a kept buffer: what the calls that want more allocate.
    static let keptByteCount = 16 * 1024

    /// The kept buffers' addresses, 0 for none (an address, since a pointer is not `Sendable`).
    private static let first = Atomic<UInt>(0)
    private static let second = Atomic<UInt>(0)

    /// Calls `body` with `byteCount` bytes of uninitialised memory, 16-byte aligned, valid for the call only.
    static func withBytes<Result, Failure: Error>(
        _ byteCount: Int,
        _ body: (UnsafeMutableRawBufferPointer) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        guard byteCount <= keptByteCount else {
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: byteCount, alignment: 16)
            defer { buffer.deallocate() }
            return try body(buffer)
        }
        let taken =
            UnsafeMutableRawPointer(bitPattern: first.exchange(0, ordering: .acquiring))
            ?? UnsafeMutableRawPointer(bitPattern: second.exchange(0, ordering: .acquiring))
            ?? UnsafeMutableRawPointer.allocate(byteCount: keptByteCount, alignment: 16)
        defer {
            let address = UInt(bitPattern: taken)
            if !first.compareExchange(expected: 0, desired: address, ordering: .releasing).exchanged,
                !second.compareExchange(expected: 0, desired: address, ordering: .releasing).exchanged
            {
                taken.deallocate()
            }
        }
        return try body(UnsafeMutableRawBufferPointer(start: taken, count: byteCount))
    }
}
