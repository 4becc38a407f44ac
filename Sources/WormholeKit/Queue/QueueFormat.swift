import Foundation

/// The bytes of a queue log, version 1 (`FORMAT.md` describes them).
///
/// A queue is one append-only file of records. Producers append a whole record with a single `write` on a
/// descriptor opened with `O_APPEND`, which the kernel serialises, so producers in any number of processes need no
/// lock. A record's position in the file (its offset) is its id: ids only grow, and one producer's records keep their
/// order. Every record starts with a magic number and ends its header with a CRC-32C, so a reader can tell a record
/// being written from a whole one, and step over a record left torn by a producer killed mid-write.
package enum QueueFormat {
    /// "WHQR", little-endian.
    package static let magic: UInt32 = 0x5251_4857
    /// Magic, body length, checksum.
    package static let headerSize = 12
    /// Timestamp and sender length, before the sender and the payload.
    package static let bodyPrefixSize = 10
    package static let maximumBodySize = 64 << 20
    /// Zeros for a record's header and body prefix, filled in once appended.
    private static let zeroPrefix = [UInt8](repeating: 0, count: headerSize + bodyPrefixSize)

    package struct Record: Equatable {
        package var timestampNanoseconds: Int64
        package var sender: [UInt8]
        /// The payload, copied once out of the read buffer, as consumers hand it over.
        package var payload: Data
    }

    package enum Parsed: Equatable {
        /// A whole record of `size` bytes.
        case record(Record, size: Int)
        /// The bytes end before the record does: being written, or not read far enough.
        case incomplete
        /// Not a record here: a torn record, a punched hole, or damage.
        case invalid
    }

    package static func encode(payload: UnsafeRawBufferPointer, sender: [UInt8], timestampNanoseconds: Int64) -> [UInt8]
    {
        var bytes: [UInt8] = []
        encode(payload: payload, sender: sender, timestampNanoseconds: timestampNanoseconds, appendingTo: &bytes)
        return bytes
    }

    /// Appends a record's bytes to `bytes`: a batch is encoded into one buffer, with no array per record.
    package static func encode(
        payload: UnsafeRawBufferPointer,
        sender: [UInt8],
        timestampNanoseconds: Int64,
        appendingTo bytes: inout [UInt8]
    ) {
        let bodySize = bodyPrefixSize + sender.count + payload.count
        let start = bytes.count
        bytes.append(contentsOf: zeroPrefix)  // the header and body prefix, stored below
        bytes.append(contentsOf: sender)
        bytes.append(contentsOf: payload)
        bytes.store(magic, at: start)
        bytes.store(UInt32(bodySize), at: start + 4)
        bytes.store(timestampNanoseconds, at: start + headerSize)
        bytes.store(UInt16(sender.count), at: start + headerSize + 8)
        // The checksum covers the length and the body, so a damaged length is caught as well.
        let crc = bytes.withUnsafeBytes { buffer in
            var crc = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: buffer[(start + 4)..<(start + 8)]))
            crc = cwormholeCRC(crc, UnsafeRawBufferPointer(rebasing: buffer[(start + headerSize)...]))
            return crc
        }
        bytes.store(crc, at: start + 8)
    }

    /// Parses the record that starts at `offset` in `bytes`.
    package static func parse(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> Parsed {
        guard bytes.count - offset >= headerSize else { return .incomplete }
        guard load(UInt32.self, bytes, offset) == magic else { return .invalid }
        let bodySize = Int(load(UInt32.self, bytes, offset + 4))
        guard bodySize >= bodyPrefixSize, bodySize <= maximumBodySize else { return .invalid }
        guard bytes.count - offset >= headerSize + bodySize else { return .incomplete }
        var crc = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[(offset + 4)..<(offset + 8)]))
        crc = cwormholeCRC(
            crc,
            UnsafeRawBufferPointer(rebasing: bytes[(offset + headerSize)..<(offset + headerSize + bodySize)])
        )
        guard crc == load(UInt32.self, bytes, offset + 8) else { return .invalid }
        let body = offset + headerSize
        let senderSize = Int(load(UInt16.self, bytes, body + 8))
        guard bodyPrefixSize + senderSize <= bodySize else { return .invalid }
        let senderStart = body + bodyPrefixSize
        return .record(
            Record(
                timestampNanoseconds: load(Int64.self, bytes, body),
                sender: Array(bytes[senderStart..<senderStart + senderSize]),
                payload: Data(UnsafeRawBufferPointer(rebasing: bytes[(senderStart + senderSize)..<(body + bodySize)]))
            ),
            size: headerSize + bodySize
        )
    }

    /// What a reader does at `offset` of bytes read from the log; `reachesEnd` says that they run to its end.
    package enum Step: Equatable {
        /// A whole record of `size` bytes: deliver it.
        case record(Record, size: Int)
        /// No record to deliver here: go on at `offset`, where a whole record starts, or one to be read whole first.
        case resume(at: Int)
        /// No record starts before `offset` in the bytes read: go on from there (past a hole, if the file has one).
        case nothingBefore(Int)
        /// The record runs past the bytes read: read `count` bytes from its start.
        case read(count: Int)
        /// Nothing whole yet at the end of the log: wait for it to grow.
        case wait
    }

    /// The reader's rule at `offset` (`FORMAT.md`, "A durable queue").
    ///
    /// A record the log ends inside is still being written, unless a whole record follows it: appends are serialised,
    /// so a record that starts after it was appended after its write ended, short, by a producer killed mid-write.
    /// Bytes that are not a record are stepped over up to the next record, whole or not yet read whole.
    package static func step(_ bytes: UnsafeRawBufferPointer, at offset: Int, reachesEnd: Bool) -> Step {
        switch parse(bytes, at: offset) {
        case .record(let record, let size):
            return .record(record, size: size)
        case .incomplete:
            if !reachesEnd {
                // A header cut short by the end of the bytes read may be no header at all: trust no length then.
                let claimed = bytes.count - offset >= 8 ? Int(load(UInt32.self, bytes, offset + 4)) : 0
                return .read(count: headerSize + (claimed <= maximumBodySize ? claimed : 0))
            }
            // Only a whole record proves this one torn: the start of one that is not whole yet may be this
            // record's own payload, still arriving.
            if let next = nextRecord(in: bytes, after: offset) { return .resume(at: next) }
            return .wait
        case .invalid:
            if let next = nextRecord(in: bytes, after: offset, orUnfinished: true) { return .resume(at: next) }
            if reachesEnd { return .wait }
            // A record may start in the last bytes, too few for its header: look there again.
            return .nothingBefore(max(bytes.count - headerSize + 1, offset + 1))
        }
    }

    /// The offset of the next whole record after `offset` (exclusive), if the bytes hold one; with `orUnfinished`, of
    /// the next record start (a magic and a length in range) whose record runs past the bytes, if that comes first.
    package static func nextRecord(
        in bytes: UnsafeRawBufferPointer,
        after offset: Int,
        orUnfinished: Bool = false
    ) -> Int? {
        var candidate = offset + 1
        while candidate + headerSize <= bytes.count {
            if bytes[candidate] == 0x57 {
                switch parse(bytes, at: candidate) {
                case .record: return candidate
                case .incomplete where orUnfinished: return candidate
                case .incomplete, .invalid: break
                }
            }
            candidate += 1
        }
        return nil
    }

    package static func load<T: FixedWidthInteger>(_ type: T.Type, _ bytes: UnsafeRawBufferPointer, _ offset: Int) -> T
    {
        T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}

/// CRC-32C continued from `crc` over `bytes`.
@inline(__always)
func cwormholeCRC(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
    CRC32C.checksum(bytes, continuing: crc)
}
