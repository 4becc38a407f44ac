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

    /// A record as parsed: where its parts lie in the bytes it was parsed from, so that parsing allocates nothing and
    /// a reader copies out only what it hands over.
    package struct Record: Equatable {
        package var timestampNanoseconds: Int64
        /// The sender's UTF-8 bytes, as offsets into the bytes parsed.
        package var sender: Range<Int>
        /// The payload, as offsets into the bytes parsed.
        package var payload: Range<Int>
    }

    package enum Parsed: Equatable {
        /// A whole record of `size` bytes.
        case record(Record, size: Int)
        /// The bytes end before the record does: being written, or not read far enough.
        case incomplete
        /// Not a record here: a torn record, a punched hole, or damage.
        case invalid
    }

    /// The size of a record holding `payloadSize` bytes from a sender of `senderSize` bytes.
    package static func recordSize(payloadSize: Int, senderSize: Int) -> Int {
        headerSize + bodyPrefixSize + senderSize + payloadSize
    }

    /// Writes a record at `destination`, which holds ``recordSize(payloadSize:senderSize:)`` bytes.
    ///
    /// Straight into raw memory: a producer of single messages builds no array per message.
    package static func encode(
        payload: UnsafeRawBufferPointer,
        sender: UnsafeRawBufferPointer,
        timestampNanoseconds: Int64,
        into destination: UnsafeMutableRawPointer
    ) {
        let bodySize = bodyPrefixSize + sender.count + payload.count
        destination.storeBytes(of: magic.littleEndian, toByteOffset: 0, as: UInt32.self)
        destination.storeBytes(of: UInt32(bodySize).littleEndian, toByteOffset: 4, as: UInt32.self)
        destination.storeBytes(of: timestampNanoseconds.littleEndian, toByteOffset: headerSize, as: Int64.self)
        destination.storeBytes(of: UInt16(sender.count).littleEndian, toByteOffset: headerSize + 8, as: UInt16.self)
        let senderStart = headerSize + bodyPrefixSize
        if let base = sender.baseAddress { (destination + senderStart).copyMemory(from: base, byteCount: sender.count) }
        if let base = payload.baseAddress {
            (destination + senderStart + sender.count).copyMemory(from: base, byteCount: payload.count)
        }
        // The checksum covers the length and the body, so a damaged length is caught as well.
        var crc = CRC32C.checksum(UnsafeRawBufferPointer(start: destination + 4, count: 4))
        crc = cwormholeCRC(crc, UnsafeRawBufferPointer(start: destination + headerSize, count: bodySize))
        destination.storeBytes(of: crc.littleEndian, toByteOffset: 8, as: UInt32.self)
    }

    /// A record's bytes, as an array: for tests and tools.
    package static func encode(payload: UnsafeRawBufferPointer, sender: [UInt8], timestampNanoseconds: Int64) -> [UInt8]
    {
        let size = recordSize(payloadSize: payload.count, senderSize: sender.count)
        return [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            sender.withUnsafeBytes { sender in
                encode(
                    payload: payload,
                    sender: sender,
                    timestampNanoseconds: timestampNanoseconds,
                    into: UnsafeMutableRawPointer(buffer.baseAddress!)
                )
            }
            initialized = size
        }
    }

    /// Parses the record that starts at `offset` in `bytes`.
    package static func parse(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> Parsed {
        guard bytes.count - offset >= headerSize else { return .incomplete }
        guard load(UInt32.self, bytes, offset) == magic else { return .invalid }
        let bodySize = Int(clamping: load(UInt32.self, bytes, offset + 4))  // no trap where Int has 32 bits
        guard bodySize >= bodyPrefixSize, bodySize <= maximumBodySize else { return .invalid }
        guard bytes.count - offset >= headerSize + bodySize else { return .incomplete }
        let base = bytes.baseAddress!
        var crc = CRC32C.checksum(UnsafeRawBufferPointer(start: base + offset + 4, count: 4))
        crc = cwormholeCRC(crc, UnsafeRawBufferPointer(start: base + offset + headerSize, count: bodySize))
        guard crc == load(UInt32.self, bytes, offset + 8) else { return .invalid }
        let body = offset + headerSize
        let senderSize = Int(load(UInt16.self, bytes, body + 8))
        guard bodyPrefixSize + senderSize <= bodySize else { return .invalid }
        let senderStart = body + bodyPrefixSize
        return .record(
            Record(
                timestampNanoseconds: load(Int64.self, bytes, body),
                sender: senderStart..<senderStart + senderSize,
                payload: senderStart + senderSize..<body + bodySize
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
                let claimed = bytes.count - offset >= 8 ? Int(clamping: load(UInt32.self, bytes, offset + 4)) : 0
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
        bytes.littleEndian(type, at: offset)
    }
}

/// CRC-32C continued from `crc` over `bytes`.
@inline(__always)
func cwormholeCRC(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
    CRC32C.checksum(bytes, continuing: crc)
}
