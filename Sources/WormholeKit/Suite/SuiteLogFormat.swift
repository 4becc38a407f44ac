import CWormholeSystem
import Foundation

/// The bytes of a suite file, version 2 (`FORMAT.md` describes them for other implementations).
///
/// A suite file is a 64-byte header and an append-only log of checksummed records: a *snapshot* of every value at a
/// version, then one *change* record per update, holding only the keys it changed. An update appends one record
/// under the file's lock, so its cost follows the keys it changes, not the size of the suite; a reader keeps the
/// values in memory and reads only the records appended since its last read. When the records after the snapshot
/// outgrow it, a writer compacts the file: a new file (the last changes as *history*, then a snapshot) renamed into
/// place.
///
/// The header has the mailbox header's magic and layout with the version 2, so that a reader of version 1 refuses
/// the file as a newer version instead of taking it for a damaged one.
package enum SuiteLogFormat {
    /// The header's version field.
    package static let version: UInt16 = 2
    package static let headerSize = MailboxFormat.headerSize
    /// "WHSR", little-endian.
    package static let recordMagic: UInt32 = 0x5253_4857
    /// Magic, body length, checksum.
    package static let recordHeaderSize = 12
    /// Kind, flags, sender length, direction length, reserved, version, time, entry count.
    package static let bodyPrefixSize = 28
    /// The value length that marks a removed key.
    package static let removedLength = UInt32.max
    /// The largest record body a reader accepts.
    package static let maximumBodySize = 1 << 30

    package enum Kind: UInt8, Sendable {
        /// An update: applied to the values.
        case change = 1
        /// Every value at a version; the values start over from it.
        case snapshot = 2
        /// An update already in the snapshot that follows: kept so that observers can catch up.
        case history = 3
    }

    package struct Record: Equatable, Sendable {
        package var kind: Kind
        package var version: UInt64
        package var timestampNanoseconds: Int64
        package var sender: String
        package var direction: String?
        /// Each key with its value as compact JSON, or nil for a removed key; sorted by key.
        package var entries: [(key: String, value: Data?)]

        package init(
            kind: Kind,
            version: UInt64,
            timestampNanoseconds: Int64,
            sender: String,
            direction: String?,
            entries: [(key: String, value: Data?)]
        ) {
            self.kind = kind
            self.version = version
            self.timestampNanoseconds = timestampNanoseconds
            self.sender = sender
            self.direction = direction
            self.entries = entries
        }

        package static func == (lhs: Record, rhs: Record) -> Bool {
            lhs.kind == rhs.kind && lhs.version == rhs.version && lhs.timestampNanoseconds == rhs.timestampNanoseconds
                && lhs.sender == rhs.sender && lhs.direction == rhs.direction
                && lhs.entries.elementsEqual(rhs.entries) { $0.key == $1.key && $0.value == $1.value }
        }
    }

    package enum Parsed: Equatable {
        /// A whole record of `size` bytes.
        case record(Record, size: Int)
        /// The bytes end before the record does: being written, or cut short.
        case incomplete
        /// Not a record here: torn, or damaged.
        case invalid
    }

    // MARK: Header

    package static func encodeHeader(generation: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: headerSize)
        bytes.replaceSubrange(0..<4, with: MailboxFormat.magic)
        bytes.store(version, at: 4)
        bytes.store(UInt16(headerSize), at: 6)
        bytes.store(generation, at: 16)
        bytes.store(CRC32C.checksum(bytes[0..<60]), at: 60)
        return bytes
    }

    /// What a suite file's first bytes say it is.
    package enum Header: Equatable {
        /// Version 1: a mailbox-format file holding a JSON document.
        case documentFile
        /// Version 2: this log, with the file's generation.
        case log(generation: UInt64)
    }

    package static func decodeHeader(_ bytes: ArraySlice<UInt8>) -> Result<Header, MailboxFormat.HeaderProblem> {
        guard bytes.count >= 8 else { return .failure(.truncated(bytes.count)) }
        let base = bytes.startIndex
        guard Array(bytes[base..<base + 4]) == MailboxFormat.magic else { return .failure(.badMagic) }
        let declared: UInt16 = bytes.load(at: 4)
        if declared == Envelope.formatVersion { return .success(.documentFile) }
        guard declared == version else { return .failure(.unsupportedVersion(declared)) }
        guard bytes.count >= headerSize else { return .failure(.truncated(bytes.count)) }
        guard bytes.load(at: 60) as UInt32 == CRC32C.checksum(bytes[base..<base + 60]) else {
            return .failure(.badChecksum)
        }
        guard bytes.load(at: 6) as UInt16 == UInt16(headerSize) else { return .failure(.badLayout) }
        return .success(.log(generation: bytes.load(at: 16)))
    }

    // MARK: Records

    /// Appends a record's bytes to `bytes`.
    package static func encode(_ record: Record, appendingTo bytes: inout [UInt8]) {
        let sender = Array(record.sender.utf8.prefix(Int(UInt16.max)))
        let direction = record.direction.map { Array($0.utf8.prefix(Int(UInt16.max) - 1)) }
        let start = bytes.count
        bytes.append(contentsOf: repeatElement(0, count: recordHeaderSize + bodyPrefixSize))
        bytes.append(contentsOf: sender)
        if let direction { bytes.append(contentsOf: direction) }
        for (key, value) in record.entries {
            let keyBytes = Array(key.utf8)
            let entryStart = bytes.count
            bytes.append(contentsOf: repeatElement(0, count: 6))
            bytes.store(UInt16(keyBytes.count), at: entryStart)
            bytes.store(value.map { UInt32($0.count) } ?? removedLength, at: entryStart + 2)
            bytes.append(contentsOf: keyBytes)
            if let value { bytes.append(contentsOf: value) }
        }
        let body = start + recordHeaderSize
        bytes.store(recordMagic, at: start)
        bytes.store(UInt32(bytes.count - body), at: start + 4)
        bytes[body] = record.kind.rawValue
        bytes[body + 1] = direction == nil ? 0 : 1
        bytes.store(UInt16(sender.count), at: body + 2)
        bytes.store(UInt16(direction?.count ?? 0), at: body + 4)
        bytes.store(record.version, at: body + 8)
        bytes.store(record.timestampNanoseconds, at: body + 16)
        bytes.store(UInt32(record.entries.count), at: body + 24)
        // The checksum covers the length and the body, so that a damaged length is caught as well.
        let crc = bytes.withUnsafeBytes { buffer in
            let length = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: buffer[(start + 4)..<(start + 8)]))
            return CRC32C.checksum(UnsafeRawBufferPointer(rebasing: buffer[body...]), continuing: length)
        }
        bytes.store(crc, at: start + 8)
    }

    /// Parses the record that starts at `offset` in `bytes`.
    package static func parse(_ bytes: ArraySlice<UInt8>, at offset: Int) -> Parsed {
        let start = bytes.startIndex + offset
        guard bytes.endIndex - start >= recordHeaderSize else { return .incomplete }
        let head = bytes[start...]
        guard head.load(at: 0) as UInt32 == recordMagic else { return .invalid }
        let bodySize = Int(clamping: head.load(at: 4) as UInt32)  // no trap where Int has 32 bits
        guard bodySize >= bodyPrefixSize, bodySize <= maximumBodySize else { return .invalid }
        guard bytes.endIndex - start >= recordHeaderSize + bodySize else { return .incomplete }
        let body = bytes[(start + recordHeaderSize)..<(start + recordHeaderSize + bodySize)]
        let crc = CRC32C.checksum(body, continuing: CRC32C.checksum(bytes[(start + 4)..<(start + 8)]))
        guard head.load(at: 8) as UInt32 == crc else { return .invalid }
        guard let record = decodeBody(body) else { return .invalid }
        return .record(record, size: recordHeaderSize + bodySize)
    }

    /// Decodes a body whose checksum matched; nil when its lengths do not add up (written by a faulty writer).
    private static func decodeBody(_ body: ArraySlice<UInt8>) -> Record? {
        guard let kind = Kind(rawValue: body[body.startIndex]) else { return nil }
        let hasDirection = body[body.startIndex + 1] & 1 != 0
        let senderLength = Int(body.load(at: 2) as UInt16)
        let directionLength = Int(body.load(at: 4) as UInt16)
        let count = Int(clamping: body.load(at: 24) as UInt32)
        var cursor = body.startIndex + bodyPrefixSize
        guard body.endIndex - cursor >= senderLength + directionLength else { return nil }
        let sender = String(decoding: body[cursor..<cursor + senderLength], as: UTF8.self)
        cursor += senderLength
        let direction = hasDirection ? String(decoding: body[cursor..<cursor + directionLength], as: UTF8.self) : nil
        cursor += directionLength
        var entries: [(key: String, value: Data?)] = []
        entries.reserveCapacity(min(count, body.count / 6))
        for _ in 0..<count {
            guard body.endIndex - cursor >= 6 else { return nil }
            let keyLength = Int(body[cursor...].load(at: 0) as UInt16)
            let valueLength = body[cursor...].load(at: 2) as UInt32
            cursor += 6
            // Clamped and compared without a sum: no trap where Int has 32 bits, whatever the length claims.
            let valueSize = valueLength == removedLength ? 0 : Int(clamping: valueLength)
            guard keyLength <= body.endIndex - cursor, valueSize <= body.endIndex - cursor - keyLength else {
                return nil
            }
            let key = String(decoding: body[cursor..<cursor + keyLength], as: UTF8.self)
            cursor += keyLength
            let value = valueLength == removedLength ? nil : Data(body[cursor..<cursor + valueSize])
            cursor += valueSize
            entries.append((key, value))
        }
        guard cursor == body.endIndex else { return nil }
        return Record(
            kind: kind,
            version: body.load(at: 8),
            timestampNanoseconds: body.load(at: 16),
            sender: sender,
            direction: direction,
            entries: entries
        )
    }

    /// Whether a whole, valid record starts anywhere after `offset` in `bytes`: bytes that do not parse are then
    /// damage in the middle of the log, not a tail left torn by a writer that died or a power cut (which leaves at
    /// most one torn record, and nothing after it).
    ///
    /// Hostile bytes (many places that start like a record, each claiming a length that fits) are taken for damage
    /// once 64 MiB were checksummed, so that the check cannot take quadratic time.
    package static func validRecordFollows(_ bytes: ArraySlice<UInt8>, after offset: Int) -> Bool {
        var candidate = offset + 1
        // A record whose head is whole (its magic and a length in bounds) was written up to where that length says,
        // and anything inside it is its own bytes (a key, a value): look for a record only after its end. A torn
        // last record claims an end past the bytes, and nothing follows it.
        if bytes.count - offset >= recordHeaderSize {
            let head = bytes[(bytes.startIndex + offset)...]
            let claimed = Int(clamping: head.load(at: 4) as UInt32)
            if head.load(at: 0) as UInt32 == recordMagic, claimed >= bodyPrefixSize, claimed <= maximumBodySize {
                candidate = offset + recordHeaderSize + claimed
            }
        }
        var budget = 64 << 20
        let magic: [UInt8] = [0x57, 0x48, 0x53, 0x52]  // "WHSR"
        while candidate + recordHeaderSize <= bytes.count {
            let start = bytes.startIndex + candidate
            if bytes[start] == magic[0], bytes[start + 1] == magic[1], bytes[start + 2] == magic[2],
                bytes[start + 3] == magic[3]
            {
                let claimed = Int(clamping: bytes[start...].load(at: 4) as UInt32)
                if claimed <= bytes.count - candidate - recordHeaderSize {
                    budget -= claimed
                    if budget < 0 { return true }
                    if case .record = parse(bytes, at: candidate) { return true }
                }
            }
            candidate += 1
        }
        return false
    }
}

extension CRC32C {
    static func checksum(_ bytes: ArraySlice<UInt8>, continuing crc: UInt32) -> UInt32 {
        bytes.withUnsafeBytes { checksum($0, continuing: crc) }
    }
}
