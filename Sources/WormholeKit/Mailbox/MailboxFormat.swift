import Foundation

/// The bytes of a mailbox file, version 1 (`FORMAT.md` describes them for other implementations).
///
/// A mailbox file is a 64-byte header and two slots of equal capacity. A writer, holding the file's lock, writes
/// the new record into the slot that does *not* hold the newest one, in place, with one `pwrite`. A reader takes
/// no lock: it reads both slots and keeps the valid record with the highest sequence. A record being written is
/// caught by its checksum and passed over, and the other slot still holds the previous message whole; so no
/// reader ever sees a torn message, and the writer never renames a file for a message that fits (but for the first
/// message of a file that holds none, which has no previous record to fall back on).
package enum MailboxFormat {
    package static let magic: [UInt8] = Array("WHMB".utf8)
    package static let headerSize = 64
    package static let recordHeaderSize = 32
    package static let minimumSlotCapacity = 512
    /// Files up to this size are read whole in one call; larger ones record by record.
    package static let wholeReadLimit = 64 * 1024
    package static let fileSuffix = ".msg"

    package struct Header: Equatable {
        package var slotCapacity: Int
        package var generation: UInt64
        package init(slotCapacity: Int, generation: UInt64) {
            self.slotCapacity = slotCapacity
            self.generation = generation
        }
        package var fileSize: Int { MailboxFormat.headerSize + 2 * slotCapacity }
        package func slotOffset(_ slot: Int) -> Int { MailboxFormat.headerSize + slot * slotCapacity }
    }

    package struct Record: Equatable {
        package static let clearedFlag: UInt16 = 1
        package var sequence: UInt64
        package var timestampNanoseconds: Int64
        package var isCleared: Bool
        package var sender: [UInt8]
        package var payload: [UInt8]
        package init(
            sequence: UInt64,
            timestampNanoseconds: Int64,
            isCleared: Bool,
            sender: [UInt8],
            payload: [UInt8]
        ) {
            self.sequence = sequence
            self.timestampNanoseconds = timestampNanoseconds
            self.isCleared = isCleared
            self.sender = sender
            self.payload = payload
        }
        package var encodedSize: Int { MailboxFormat.recordHeaderSize + sender.count + payload.count }
    }

    /// What a slot was found to hold.
    package enum SlotContent: Equatable {
        case empty
        case valid(Record)
        /// A record whose checksum or lengths do not match: being written right now, or damaged.
        case invalid
    }

    /// The newest valid record of a file, and which slot holds it.
    package struct Contents {
        package var header: Header
        package var newest: (slot: Int, record: Record)?
    }

    // MARK: Encoding

    package static func slotCapacity(forRecordSize size: Int) -> Int {
        var capacity = minimumSlotCapacity
        while capacity < size { capacity *= 2 }
        return capacity
    }

    package static func encodeHeader(_ header: Header) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: headerSize)
        bytes.replaceSubrange(0..<4, with: magic)
        bytes.store(Envelope.formatVersion, at: 4)
        bytes.store(UInt16(headerSize), at: 6)
        bytes.store(UInt32(header.slotCapacity), at: 8)
        bytes.store(header.generation, at: 16)
        bytes.store(CRC32C.checksum(bytes[0..<60]), at: 60)
        return bytes
    }

    package static func encodeRecord(_ record: Record) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: recordHeaderSize)
        bytes.reserveCapacity(record.encodedSize)
        bytes.store(record.isCleared ? Record.clearedFlag : 0, at: 4)
        bytes.store(UInt16(record.sender.count), at: 6)
        bytes.store(record.sequence, at: 8)
        bytes.store(record.timestampNanoseconds, at: 16)
        bytes.store(UInt32(record.payload.count), at: 24)
        bytes.append(contentsOf: record.sender)
        bytes.append(contentsOf: record.payload)
        bytes.store(CRC32C.checksum(bytes[4...]), at: 0)
        return bytes
    }

    /// A new file's bytes: the header, `record` in slot 0, and an empty slot 1.
    package static func encodeFile(header: Header, record: Record) -> [UInt8] {
        var bytes = encodeHeader(header)
        bytes.append(contentsOf: encodeRecord(record))
        bytes.append(contentsOf: repeatElement(0, count: header.fileSize - bytes.count))
        return bytes
    }

    /// A file that holds no message: the header and two empty slots, as a listener makes it to watch it.
    package static func encodeEmptyFile(header: Header) -> [UInt8] {
        encodeHeader(header) + repeatElement(0, count: header.fileSize - headerSize)
    }

    // MARK: Decoding

    package static func decodeHeader(_ bytes: ArraySlice<UInt8>) -> Result<Header, HeaderProblem> {
        guard bytes.count >= headerSize else { return .failure(.truncated(bytes.count)) }
        let base = bytes.startIndex
        guard Array(bytes[base..<base + 4]) == magic else { return .failure(.badMagic) }
        // The version comes before the checksum: a later version may lay the header out differently.
        let version: UInt16 = bytes.load(at: 4)
        guard version == Envelope.formatVersion else { return .failure(.unsupportedVersion(version)) }
        guard bytes.load(at: 60) as UInt32 == CRC32C.checksum(bytes[base..<base + 60]) else {
            return .failure(.badChecksum)
        }
        let declaredHeaderSize: UInt16 = bytes.load(at: 6)
        let capacity = Int(bytes.load(at: 8) as UInt32)
        guard declaredHeaderSize == headerSize, capacity >= minimumSlotCapacity, capacity & (capacity - 1) == 0 else {
            return .failure(.badLayout)
        }
        return .success(Header(slotCapacity: capacity, generation: bytes.load(at: 16)))
    }

    package enum HeaderProblem: Error, Equatable {
        case truncated(Int)
        case badMagic
        case unsupportedVersion(UInt16)
        case badChecksum
        case badLayout
    }

    /// The length a slot's record claims, or nil when the claim cannot fit in the slot.
    package static func claimedRecordSize(_ head: ArraySlice<UInt8>, capacity: Int) -> Int? {
        guard head.count >= recordHeaderSize else { return nil }
        let size = recordHeaderSize + Int(head.load(at: 6) as UInt16) + Int(head.load(at: 24) as UInt32)
        return size <= capacity ? size : nil
    }

    package static func decodeSlot(_ bytes: ArraySlice<UInt8>, capacity: Int) -> SlotContent {
        if bytes.count >= recordHeaderSize, bytes.prefix(recordHeaderSize).allSatisfy({ $0 == 0 }) { return .empty }
        guard let size = claimedRecordSize(bytes, capacity: capacity), bytes.count >= size else { return .invalid }
        let base = bytes.startIndex
        guard bytes.load(at: 0) as UInt32 == CRC32C.checksum(bytes[(base + 4)..<(base + size)]) else {
            return .invalid
        }
        let sequence: UInt64 = bytes.load(at: 8)
        guard sequence > 0 else { return .invalid }
        let senderLength = Int(bytes.load(at: 6) as UInt16)
        let senderStart = base + recordHeaderSize
        return .valid(
            Record(
                sequence: sequence,
                timestampNanoseconds: bytes.load(at: 16),
                isCleared: (bytes.load(at: 4) as UInt16) & Record.clearedFlag != 0,
                sender: Array(bytes[senderStart..<senderStart + senderLength]),
                payload: Array(bytes[(senderStart + senderLength)..<(base + size)])
            )
        )
    }

    /// Reads a mailbox file through `read(count, offset)` and finds its newest valid record.
    ///
    /// Small files are read with one call. Of a large file, the slot heads are read first, then only the record
    /// that is newest; if that one turns out torn, the other.
    package static func decodeFile(
        size: Int,
        read: (_ count: Int, _ offset: Int) throws(WormholeError) -> [UInt8]
    ) throws(WormholeError) -> Result<Contents, FileProblem> {
        let whole = size <= wholeReadLimit ? try read(size, 0) : nil
        let headerBytes: ArraySlice<UInt8>
        if let whole {
            headerBytes = whole[0..<min(whole.count, headerSize)]
        } else {
            headerBytes = try read(headerSize, 0)[...]
        }
        let header: Header
        switch decodeHeader(headerBytes) {
        case .success(let decoded): header = decoded
        case .failure(let problem): return .failure(.header(problem))
        }
        guard size >= header.fileSize else { return .failure(.truncated(size: size, expected: header.fileSize)) }

        func slotBytes(_ slot: Int, count: Int) throws(WormholeError) -> ArraySlice<UInt8> {
            let offset = header.slotOffset(slot)
            if let whole { return whole[offset..<min(whole.count, offset + count)] }
            return try read(count, offset)[...]
        }
        // Order the slots by the sequence their heads claim; verify the newest first.
        var candidates: [(slot: Int, sequence: UInt64)] = []
        var sawDamage = false
        for slot in 0..<2 {
            let head = try slotBytes(slot, count: recordHeaderSize)
            if head.count == recordHeaderSize, head.allSatisfy({ $0 == 0 }) { continue }
            guard claimedRecordSize(head, capacity: header.slotCapacity) != nil else {
                sawDamage = true
                continue
            }
            candidates.append((slot, head.load(at: 8)))
        }
        for candidate in candidates.sorted(by: { $0.sequence > $1.sequence }) {
            let head = try slotBytes(candidate.slot, count: recordHeaderSize)
            guard let recordSize = claimedRecordSize(head, capacity: header.slotCapacity) else { continue }
            switch decodeSlot(try slotBytes(candidate.slot, count: recordSize), capacity: header.slotCapacity) {
            case .valid(let record): return .success(Contents(header: header, newest: (candidate.slot, record)))
            case .empty, .invalid: sawDamage = true
            }
        }
        return sawDamage ? .failure(.noValidRecord) : .success(Contents(header: header, newest: nil))
    }

    package enum FileProblem: Error, Equatable {
        case header(HeaderProblem)
        case truncated(size: Int, expected: Int)
        case noValidRecord
    }

    package static func error(for problem: FileProblem, identifier: String, path: String) -> WormholeError {
        switch problem {
        case .header(.truncated(let size)), .truncated(let size, _):
            return WormholeError(
                .truncatedMessage,
                "The mailbox file is truncated (\(size) bytes); it was cut short outside the wormhole. "
                    + "Passing a new message replaces it.",
                identifier: identifier,
                path: path
            )
        case .header(.unsupportedVersion(let version)):
            return WormholeError(
                .unsupportedFormatVersion,
                "The mailbox file has format version \(version); this build reads version \(Envelope.formatVersion). "
                    + "Update WormholeKit in every process of the group.",
                identifier: identifier,
                path: path
            )
        case .header(.badMagic), .header(.badChecksum), .header(.badLayout):
            return WormholeError(
                .corruptMessage,
                "The mailbox file's header is damaged or it is not a wormhole file. Passing a new message replaces it.",
                identifier: identifier,
                path: path
            )
        case .noValidRecord:
            return WormholeError(
                .corruptMessage,
                "The mailbox file holds no record whose checksum matches. Passing a new message replaces it.",
                identifier: identifier,
                path: path
            )
        }
    }
}

// Little-endian loads and stores on byte arrays: the format is little-endian on every platform.
extension Array where Element == UInt8 {
    mutating func store<T: FixedWidthInteger>(_ value: T, at offset: Int) {
        precondition(offset >= 0 && offset + MemoryLayout<T>.size <= count, "store past the end of the bytes")
        // In place: every record encoded on the way from pass to listener stores a few integers.
        withUnsafeMutableBytes { $0.storeBytes(of: value.littleEndian, toByteOffset: offset, as: T.self) }
    }
}

extension ArraySlice where Element == UInt8 {
    /// Loads a little-endian integer at `offset` from the slice's start.
    func load<T: FixedWidthInteger>(at offset: Int) -> T {
        var value = T.zero
        let start = startIndex + offset
        for index in (0..<MemoryLayout<T>.size).reversed() { value = value << 8 | T(self[start + index]) }
        return value
    }
}
