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
        let size = record.encodedSize
        return [UInt8](unsafeUninitializedCapacity: size) { buffer, initialized in
            record.sender.withUnsafeBytes { sender in
                record.payload.withUnsafeBytes { payload in
                    encodeRecord(
                        sequence: record.sequence,
                        timestampNanoseconds: record.timestampNanoseconds,
                        isCleared: record.isCleared,
                        sender: sender,
                        payload: payload,
                        into: UnsafeMutableRawPointer(buffer.baseAddress!)
                    )
                }
            }
            initialized = size
        }
    }

    /// The size of a record of `senderSize` and `payloadSize` bytes.
    package static func recordSize(senderSize: Int, payloadSize: Int) -> Int {
        recordHeaderSize + senderSize + payloadSize
    }

    /// Writes a record at `destination`, which holds ``recordSize(senderSize:payloadSize:)`` bytes: a pass builds no
    /// array for its record.
    package static func encodeRecord(
        sequence: UInt64,
        timestampNanoseconds: Int64,
        isCleared: Bool,
        sender: UnsafeRawBufferPointer,
        payload: UnsafeRawBufferPointer,
        into destination: UnsafeMutableRawPointer
    ) {
        let size = recordSize(senderSize: sender.count, payloadSize: payload.count)
        destination.storeBytes(of: (isCleared ? Record.clearedFlag : 0).littleEndian, toByteOffset: 4, as: UInt16.self)
        destination.storeBytes(of: UInt16(sender.count).littleEndian, toByteOffset: 6, as: UInt16.self)
        destination.storeBytes(of: sequence.littleEndian, toByteOffset: 8, as: UInt64.self)
        destination.storeBytes(of: timestampNanoseconds.littleEndian, toByteOffset: 16, as: Int64.self)
        destination.storeBytes(of: UInt32(payload.count).littleEndian, toByteOffset: 24, as: UInt32.self)
        destination.storeBytes(of: UInt32(0), toByteOffset: 28, as: UInt32.self)
        if let base = sender.baseAddress {
            (destination + recordHeaderSize).copyMemory(from: base, byteCount: sender.count)
        }
        if let base = payload.baseAddress {
            (destination + recordHeaderSize + sender.count).copyMemory(from: base, byteCount: payload.count)
        }
        let crc = CRC32C.checksum(UnsafeRawBufferPointer(start: destination + 4, count: size - 4))
        destination.storeBytes(of: crc.littleEndian, toByteOffset: 0, as: UInt32.self)
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
        bytes.withUnsafeBytes { decodeHeader($0) }
    }

    package static func decodeHeader(_ bytes: UnsafeRawBufferPointer) -> Result<Header, HeaderProblem> {
        guard bytes.count >= headerSize else { return .failure(.truncated(bytes.count)) }
        guard load(UInt32.self, bytes, 0) == magicNumber else { return .failure(.badMagic) }
        // The version comes before the checksum: a later version may lay the header out differently.
        let version = load(UInt16.self, bytes, 4)
        guard version == Envelope.formatVersion else { return .failure(.unsupportedVersion(version)) }
        guard load(UInt32.self, bytes, 60) == CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[0..<60])) else {
            return .failure(.badChecksum)
        }
        let declaredHeaderSize = load(UInt16.self, bytes, 6)
        // Clamped, and bounded so that the file's size is an Int: no trap where Int has 32 bits.
        let capacity = Int(clamping: load(UInt32.self, bytes, 8))
        guard declaredHeaderSize == headerSize, capacity >= minimumSlotCapacity, capacity & (capacity - 1) == 0,
            capacity <= Int.max / 4
        else {
            return .failure(.badLayout)
        }
        return .success(Header(slotCapacity: capacity, generation: load(UInt64.self, bytes, 16)))
    }

    /// ``magic`` as the little-endian integer a header starts with.
    private static let magicNumber = magic.withUnsafeBytes { $0.littleEndian(UInt32.self, at: 0) }

    package enum HeaderProblem: Error, Equatable {
        case truncated(Int)
        case badMagic
        case unsupportedVersion(UInt16)
        case badChecksum
        case badLayout
    }

    /// The length a slot's record claims, or nil when the claim cannot fit in the slot.
    package static func claimedRecordSize(_ head: UnsafeRawBufferPointer, capacity: Int) -> Int? {
        guard head.count >= recordHeaderSize else { return nil }
        let payloadSize = Int(clamping: load(UInt32.self, head, 24))  // no trap where Int has 32 bits
        guard payloadSize <= capacity else { return nil }
        let size = recordHeaderSize + Int(load(UInt16.self, head, 6)) + payloadSize
        return size <= capacity ? size : nil
    }

    /// A valid record, as offsets into the bytes of its slot: decoding copies nothing, and a reader copies out only
    /// what it hands over.
    package struct RecordView: Equatable {
        package var sequence: UInt64
        package var timestampNanoseconds: Int64
        package var isCleared: Bool
        /// The sender's UTF-8 bytes, as offsets into the slot's bytes.
        package var sender: Range<Int>
        /// The payload, as offsets into the slot's bytes.
        package var payload: Range<Int>

        /// The record, copied out of `slot`, the bytes it was decoded from.
        package func record(in slot: UnsafeRawBufferPointer) -> Record {
            Record(
                sequence: sequence,
                timestampNanoseconds: timestampNanoseconds,
                isCleared: isCleared,
                sender: Array(slot[sender]),
                payload: Array(slot[payload])
            )
        }
    }

    /// What a slot was found to hold, as offsets into its bytes.
    package enum SlotView: Equatable {
        case empty
        case valid(RecordView)
        /// A record whose checksum or lengths do not match: being written right now, or damaged.
        case invalid
    }

    package static func decodeSlot(_ bytes: ArraySlice<UInt8>, capacity: Int) -> SlotContent {
        bytes.withUnsafeBytes { slot in
            switch decodeSlot(slot, capacity: capacity) {
            case .empty: .empty
            case .invalid: .invalid
            case .valid(let view): .valid(view.record(in: slot))
            }
        }
    }

    package static func decodeSlot(_ bytes: UnsafeRawBufferPointer, capacity: Int) -> SlotView {
        if bytes.count >= recordHeaderSize, isZero(UnsafeRawBufferPointer(rebasing: bytes[0..<recordHeaderSize])) {
            return .empty
        }
        guard let size = claimedRecordSize(bytes, capacity: capacity), bytes.count >= size else { return .invalid }
        guard load(UInt32.self, bytes, 0) == CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[4..<size])) else {
            return .invalid
        }
        let sequence = load(UInt64.self, bytes, 8)
        guard sequence > 0 else { return .invalid }
        let senderEnd = recordHeaderSize + Int(load(UInt16.self, bytes, 6))
        return .valid(
            RecordView(
                sequence: sequence,
                timestampNanoseconds: load(Int64.self, bytes, 16),
                isCleared: load(UInt16.self, bytes, 4) & Record.clearedFlag != 0,
                sender: recordHeaderSize..<senderEnd,
                payload: senderEnd..<size
            )
        )
    }

    /// A mailbox file's header and its newest valid record, which `bytes` holds (valid only for the call that gets
    /// it).
    package struct Found {
        package var header: Header
        package var newest: (slot: Int, record: RecordView, bytes: UnsafeRawBufferPointer)?
    }

    /// Reads a mailbox file through `read(count, offset)` and finds its newest valid record, copied into arrays.
    package static func decodeFile(
        size: Int,
        read: (_ count: Int, _ offset: Int) throws(WormholeError) -> [UInt8]
    ) throws(WormholeError) -> Result<Contents, FileProblem> {
        try withNewestRecord(size: size) { (buffer, offset) throws(WormholeError) in
            let bytes = try read(buffer.count, offset)
            let count = min(bytes.count, buffer.count)
            bytes.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            return count
        } _: { found in
            found.map { found in
                Contents(
                    header: found.header,
                    newest: found.newest.map { ($0.slot, $0.record.record(in: $0.bytes)) }
                )
            }
        }
    }

    /// Reads a mailbox file through `read`, which fills the buffer it is given from an offset and returns how many
    /// bytes it read, and hands its newest valid record to `body`.
    ///
    /// Small files are read with one call into reused memory (``ScratchMemory``). Of a large file, the slot heads are read first,
    /// then only the record that is newest; if that one turns out torn, the other.
    package static func withNewestRecord<Value>(
        size: Int,
        read: (_ buffer: UnsafeMutableRawBufferPointer, _ offset: Int) throws(WormholeError) -> Int,
        _ body: (Result<Found, FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value {
        guard size <= wholeReadLimit else { return try withNewestRecordOfLargeFile(size: size, read: read, body) }
        // Reused memory, not `withUnsafeTemporaryAllocation`: a small message's file (1,088 bytes) is past what that
        // puts on the stack, and would be allocated on every pass and every read.
        return try ScratchMemory.withBytes(max(size, 1)) { (buffer) throws(WormholeError) -> Value in
            let count = try read(UnsafeMutableRawBufferPointer(rebasing: buffer[0..<size]), 0)
            return try findNewest(inWhole: UnsafeRawBufferPointer(rebasing: buffer[0..<count]), size: size, body)
        }
    }

    /// ``withNewestRecord(size:read:_:)`` for a file whose size is not known: it reads up to
    /// ``ScratchMemory/keptByteCount`` bytes, and the file's size is what the read got. Returns nil, calling nothing,
    /// when the read filled that memory: the file may be larger.
    package static func withNewestRecordOfSmallFile<Value>(
        read: (_ buffer: UnsafeMutableRawBufferPointer, _ offset: Int) throws(WormholeError) -> Int,
        _ body: (Result<Found, FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value? {
        try ScratchMemory.withBytes(ScratchMemory.keptByteCount) { (buffer) throws(WormholeError) -> Value? in
            let count = try read(buffer, 0)
            guard count < buffer.count else { return nil }
            return try findNewest(inWhole: UnsafeRawBufferPointer(rebasing: buffer[0..<count]), size: count, body)
        }
    }

    /// The reader's rule on a file read whole into `whole` (fewer bytes than `size` where it was cut short meanwhile).
    private static func findNewest<Value>(
        inWhole whole: UnsafeRawBufferPointer,
        size: Int,
        _ body: (Result<Found, FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value {
        try findNewest(
            size: size,
            header: part(of: whole, at: 0, count: headerSize),
            head: { header, slot in part(of: whole, at: header.slotOffset(slot), count: recordHeaderSize) },
            record: { header, slot, count in part(of: whole, at: header.slotOffset(slot), count: count) },
            body
        )
    }

    /// `count` bytes of `whole` from `offset`: fewer, or none, where the file was cut short meanwhile. (A function of
    /// its own, not nested: the closures that called a nested one allocated a context per call.)
    @inline(__always)
    private static func part(of whole: UnsafeRawBufferPointer, at offset: Int, count: Int) -> UnsafeRawBufferPointer {
        let start = min(whole.count, offset)
        return UnsafeRawBufferPointer(rebasing: whole[start..<min(whole.count, start + count)])
    }

    /// ``withNewestRecord(size:read:_:)`` for a file too large to read whole: the header and the slot heads, then
    /// one record at a time, into memory allocated for the call.
    private static func withNewestRecordOfLargeFile<Value>(
        size: Int,
        read: (_ buffer: UnsafeMutableRawBufferPointer, _ offset: Int) throws(WormholeError) -> Int,
        _ body: (Result<Found, FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value {
        // The header, then each slot's head after it.
        let small = UnsafeMutableRawBufferPointer.allocate(byteCount: headerSize + 2 * recordHeaderSize, alignment: 16)
        defer { small.deallocate() }
        var record = UnsafeMutableRawBufferPointer(start: nil, count: 0)
        defer { record.deallocate() }
        func readPart(
            into target: UnsafeMutableRawBufferPointer,
            at offset: Int
        ) throws(WormholeError)
            -> UnsafeRawBufferPointer
        {
            UnsafeRawBufferPointer(rebasing: target[0..<(try read(target, offset))])
        }
        return try findNewest(
            size: size,
            header: try readPart(into: UnsafeMutableRawBufferPointer(rebasing: small[0..<headerSize]), at: 0),
            head: { (header, slot) throws(WormholeError) in
                let start = headerSize + slot * recordHeaderSize
                let target = UnsafeMutableRawBufferPointer(rebasing: small[start..<start + recordHeaderSize])
                return try readPart(into: target, at: header.slotOffset(slot))
            },
            record: { (header, slot, count) throws(WormholeError) in
                if record.count < count {
                    record.deallocate()
                    record = .allocate(byteCount: count, alignment: 16)
                }
                let target = UnsafeMutableRawBufferPointer(rebasing: record[0..<count])
                return try readPart(into: target, at: header.slotOffset(slot))
            },
            body
        )
    }

    /// The reader's rule, on bytes got through `head` (a slot's first ``recordHeaderSize`` bytes, each read once) and
    /// `record` (a slot's first `count` bytes, valid until the next call): the header, the size the file must have,
    /// then the slots whose heads claim a record that fits, the higher sequence first, and the first of them whose
    /// checksum matches.
    @inline(__always)  // its closures inlined: the small file's slices cost nothing
    private static func findNewest<Value>(
        size: Int,
        header headerBytes: UnsafeRawBufferPointer,
        head: (Header, Int) throws(WormholeError) -> UnsafeRawBufferPointer,
        record: (Header, Int, Int) throws(WormholeError) -> UnsafeRawBufferPointer,
        _ body: (Result<Found, FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value {
        let header: Header
        switch decodeHeader(headerBytes) {
        case .success(let decoded): header = decoded
        case .failure(let problem): return try body(.failure(.header(problem)))
        }
        guard size >= header.fileSize else {
            return try body(.failure(.truncated(size: size, expected: header.fileSize)))
        }
        var claims: (first: Claim?, second: Claim?) = (nil, nil)
        var sawDamage = false
        for slot in 0..<2 {
            let bytes = try head(header, slot)
            if bytes.count == recordHeaderSize, isZero(bytes) { continue }
            guard let size = claimedRecordSize(bytes, capacity: header.slotCapacity) else {
                sawDamage = true
                continue
            }
            let claim = Claim(slot: slot, sequence: load(UInt64.self, bytes, 8), size: size)
            if claims.first == nil { claims.first = claim } else { claims.second = claim }
        }
        // The higher sequence first; slot 0 first on a tie.
        if let first = claims.first, let second = claims.second, second.sequence > first.sequence {
            claims = (second, first)
        }
        for index in 0..<2 {  // not `for claim in [first, second]`: that array was allocated per call
            guard let claim = index == 0 ? claims.first : claims.second else { continue }
            let bytes = try record(header, claim.slot, claim.size)
            switch decodeSlot(bytes, capacity: header.slotCapacity) {
            case .valid(let view): return try body(.success(Found(header: header, newest: (claim.slot, view, bytes))))
            case .empty, .invalid: sawDamage = true
            }
        }
        return try body(sawDamage ? .failure(.noValidRecord) : .success(Found(header: header, newest: nil)))
    }

    /// A slot whose head claims a record that fits: its sequence and the record's size, as the head says.
    private struct Claim {
        var slot: Int
        var sequence: UInt64
        var size: Int
    }

    private static func isZero(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        while index + 8 <= bytes.count {
            if bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { return false }
            index += 8
        }
        while index < bytes.count {
            if bytes[index] != 0 { return false }
            index += 1
        }
        return true
    }

    /// A little-endian integer at `offset` of `bytes`.
    private static func load<T: FixedWidthInteger>(_ type: T.Type, _ bytes: UnsafeRawBufferPointer, _ offset: Int) -> T
    {
        bytes.littleEndian(type, at: offset)
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

extension UnsafeRawBufferPointer {
    /// The little-endian integer at `offset`, wherever it is aligned: how every format here reads its fields.
    func littleEndian<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T {
        T(littleEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
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
