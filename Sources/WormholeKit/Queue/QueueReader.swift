import Foundation
import SystemPackage

/// Reads a queue log record by record from a position, reading ahead in large chunks.
///
/// It steps over what is not a record: a hole punched where consumed messages were reclaimed, and a record torn by a
/// producer killed mid-write. A record the log ends inside is taken as torn only when a whole record follows it
/// (appends are serialised, so a later whole record means the earlier one will never be finished); otherwise it is
/// taken as being written, and the reader waits. ``QueueFormat/step(_:at:reachesEnd:)`` holds the rule.
struct QueueReader {
    static let chunkSize = 256 * 1024

    let descriptor: Int32
    /// The offset of the next record to read.
    private(set) var position: UInt64
    /// The chunk of the log read last, allocated once and reused: a fresh 256 KiB array per read would cost page
    /// faults and zeroing on every wake-up.
    private let buffer = ReusableBuffer(capacity: chunkSize, keepingUpTo: 4 * chunkSize)
    private var bufferStart: UInt64 = 0
    private var bufferReachedEnd = false

    init(descriptor: Int32, position: UInt64) {
        self.descriptor = descriptor
        self.position = position
    }

    struct Item {
        /// Where the record's parts lie in the reader's buffer, until the next call of ``next()``.
        var record: QueueFormat.Record
        var offset: UInt64
        var end: UInt64
    }

    /// The sender's bytes and the payload of `item`, the last record ``next()`` returned.
    func withParts<Result>(
        of item: Item,
        _ body: (_ sender: UnsafeRawBufferPointer, _ payload: UnsafeRawBufferPointer) -> Result
    ) -> Result {
        let bytes = buffer.bytes
        return body(
            UnsafeRawBufferPointer(rebasing: bytes[item.record.sender]),
            UnsafeRawBufferPointer(rebasing: bytes[item.record.payload])
        )
    }

    /// Moves past a record that was delivered (or given up on).
    mutating func advance(to end: UInt64) { position = max(position, end) }

    /// Goes back to a position read past but not acknowledged: a batch its handler did not take.
    mutating func rewind(to start: UInt64) { position = start }

    /// The record at the reading position, or nil when none is whole yet.
    mutating func next() throws(WormholeError) -> Item? {
        var freshlyRead = false
        while true {
            // A whole record already in the buffer is final (appends never change it): only a record not yet
            // whole, or the end of the buffer, calls for reading again.
            let inBuffer = position >= bufferStart && position < bufferStart + UInt64(buffer.count)
            if !inBuffer {
                try fill(from: position, count: Self.chunkSize)
                freshlyRead = true
                if buffer.isEmpty { return nil }
            }
            let offset = Int(position - bufferStart)
            let reachesEnd = bufferReachedEnd
            switch QueueFormat.step(buffer.bytes, at: offset, reachesEnd: reachesEnd) {
            case .record(let record, let size):
                return Item(record: record, offset: position, end: position + UInt64(size))
            case .resume(let next):
                // What lies before is torn or no record: it can never be delivered.
                position = bufferStart + UInt64(next)
            case .nothingBefore(let end):
                // A stretch with no record in it, such as a reclaimed hole: jump to the next data.
                position = nextData(after: bufferStart + UInt64(end))
                freshlyRead = false
                buffer.removeAll()
            case .read(let count):
                // A record longer than what was read: read it whole, or up to the end of the log.
                try fill(from: position, count: max(count, Self.chunkSize))
                freshlyRead = true
            case .wait:
                // The end of the log as read: once read afresh, a record not yet whole is waited for.
                if freshlyRead { return nil }
                try fill(from: position, count: Self.chunkSize)
                freshlyRead = true
            }
        }
    }

    private mutating func fill(from offset: UInt64, count: Int) throws(WormholeError) {
        switch buffer.read(Descriptor(rawValue: descriptor), count: count, at: offset) {
        case .success(let read):
            bufferStart = offset
            bufferReachedEnd = read < count
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "read the queue", path: nil)
        }
    }

    /// The first offset at or after `offset` that holds data (holes are skipped), or `offset`.
    private func nextData(after offset: UInt64) -> UInt64 {
        Descriptor(rawValue: descriptor).nextData(from: offset) ?? offset
    }
}
