import Foundation
import Synchronization

/// A consumer's stored position, in two slots of 48 bytes (at offsets 0 and 64) that its writer fills in turn.
///
/// A slot begins as the first format did: 16 bytes, `WHQC`, a CRC-32C of the offset, the offset (little-endian);
/// then 20 optional bytes that name the record ending at the offset (its start and timestamp, with a CRC-32C that
/// covers the offset too), so that a position the log no longer backs is recognised; then a generation and a CRC-32C of
/// bytes 8–43, which tell the newer slot. Readers of the first 16 or 36 bytes alone read the first slot, which is at
/// most one acknowledgement behind. `FORMAT.md` gives the rules.
///
/// Without `synchronizesWrites`, a consumer stores its positions through a shared mapping of the file (a store to
/// memory that outlives the process, where a `pwrite` costs a system call per message), into the slot that does not
/// hold the newest: a process killed in the middle of a store leaves that slot torn and the other one whole. A store
/// a second or more after the last write goes through the descriptor instead, which moves the file's modification
/// time (how recently the consumer was seen).
package final class QueueCursorFile: Sendable {
    /// The record a stored position ends: where it starts and its timestamp.
    package struct LastRecord: Equatable, Sendable {
        package var start: UInt64
        package var timestampNanoseconds: Int64

        package init(start: UInt64, timestampNanoseconds: Int64) {
            self.start = start
            self.timestampNanoseconds = timestampNanoseconds
        }
    }

    /// What one slot holds.
    package struct Slot: Equatable, Sendable {
        package var offset: UInt64
        package var last: LastRecord?
        /// Which of two slots is newer; nil when a writer of the first format wrote the slot (or a store was cut
        /// before it).
        package var generation: UInt64?
    }

    /// What a position file holds.
    package enum Contents: Equatable, Sendable {
        /// No position yet: a consumer being created.
        case empty
        /// The newest whole slot.
        case position(Slot)
        /// Neither slot is whole.
        case damaged
    }

    private static let magic: UInt32 = 0x4351_4857  // "WHQC"
    /// The bytes of one slot, and where the second one starts.
    package static let slotSize = 48
    package static let secondSlot = 64
    package static let fileSize = secondSlot + slotSize
    /// The longest the file's modification time may lag behind stores through the mapping.
    private static let writeInterval = Duration.seconds(1)

    /// Whether consumers store positions through the mapping. The power-loss explorer turns it off in the workloads
    /// it traces: it sees system calls, not stores to memory, and a store to a shared mapping reaches the disk as a
    /// `pwrite` without `fsync` does (by the page cache's write-back), so the writes it traces model the same states.
    package static let storesThroughMapping = Atomic<Bool>(true)

    /// The writer's side: used by one cursor at a time, under this lock (uncontended).
    private struct WriterState {
        var generation: UInt64 = 0
        /// The slot holding the newest position.
        var newestSlot = 0
        /// The file mapped, once a write through the descriptor made it whole.
        var mapping: UnsafeMutableRawPointer?
        /// When the position was last written through the descriptor.
        var lastWrite = ContinuousClock.now
    }

    private let descriptor: Int32
    private let writer = Locked(WriterState())
    package let name: String
    package let path: String

    init(directory: DirectoryHandle, name: String, create: Bool) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.path = directory.filePath(name)
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: name, flags: O_RDWR | (create ? O_CREAT : 0))
        } catch {
            throw WormholeError.fileSystem(
                error,
                "open the position of consumer \(name)",
                path: directory.filePath(name)
            )
        }
        guard try directory.trustedStatus(of: file.descriptor, name: name, identifier: nil) != nil else {
            throw WormholeError(.ioFailure, "The consumer's position file was removed while opening it.", path: path)
        }
        descriptor = file.release()
    }

    deinit {
        if let mapping = writer.withLock({ $0.mapping }) { munmap(mapping, Self.fileSize) }
        Descriptor(rawValue: descriptor).close()
    }

    // MARK: Reading

    /// The stored offset, or nil for a consumer that has not handled anything yet.
    package func read() throws(WormholeError) -> UInt64? {
        try readWithLastRecord()?.offset
    }

    /// The stored offset and, when stored with it, the record it ends.
    package func readWithLastRecord() throws(WormholeError) -> (offset: UInt64, last: LastRecord?)? {
        // A slot being stored by its consumer reads as torn; the other one is whole. Both can read torn only while a
        // write through the descriptor replaces them together: read again.
        for attempt in 1...3 {
            let bytes: [UInt8]
            switch Descriptor(rawValue: descriptor).read(count: Self.fileSize, at: 0) {
            case .success(let read): bytes = read
            case .failure(let errno):
                throw WormholeError.fileSystem(errno, "read the position of consumer \(name)", path: path)
            }
            switch Self.decodeFile(bytes) {
            case .empty: return nil
            case .position(let slot): return (slot.offset, slot.last)
            case .damaged where attempt < 3: continue
            case .damaged: break
            }
        }
        throw WormholeError(
            .corruptMessage,
            "The position of consumer \(name) is damaged. Remove the file to start that consumer over from the "
                + "oldest message kept.",
            path: path
        )
    }

    /// Decodes a position file: the newer of its whole slots.
    package static func decodeFile(_ bytes: [UInt8]) -> Contents {
        if bytes.isEmpty { return .empty }
        let first = decodeSlot(bytes[...])
        // The second slot counts only whole, generation and all: a writer of the first format never writes it.
        let second =
            bytes.count >= fileSize
            ? decodeSlot(bytes[secondSlot..<fileSize]).flatMap { $0.generation == nil ? nil : $0 } : nil
        switch (first, second) {
        case (let first?, let second?):
            // A first slot without a generation was written last, by an older writer (which reads and writes that
            // slot alone) or by a store cut after the offset, which is the newest either way.
            guard let generation = first.generation, let other = second.generation, other > generation else {
                return .position(first)
            }
            return .position(second)
        case (let first?, nil): return .position(first)
        case (nil, let second?): return .position(second)
        case (nil, nil): return .damaged
        }
    }

    /// One slot: nil unless its first 16 bytes are whole.
    package static func decodeSlot(_ slot: ArraySlice<UInt8>) -> Slot? {
        let bytes = Array(slot)
        guard bytes.count >= 16, let offset = decode(Array(bytes[0..<16]))?.offset else { return nil }
        var result = Slot(offset: offset, last: decodeLastRecord(bytes, offset: offset), generation: nil)
        if bytes.count >= slotSize {
            let covered = bytes.withUnsafeBytes { UnsafeRawBufferPointer(rebasing: $0[8..<44]) }
            if bytes[...].load(at: 44) as UInt32 == CRC32C.checksum(covered) {
                result.generation = bytes[...].load(at: 36)
            }
        }
        return result
    }

    /// The record named after the first 16 bytes, if they hold a valid one for `offset` (an older writer's 16 bytes
    /// over a newer file leave a tail whose checksum no longer matches).
    package static func decodeLastRecord(_ bytes: [UInt8], offset: UInt64) -> LastRecord? {
        guard bytes.count >= 36 else { return nil }
        var covered = [UInt8](repeating: 0, count: 24)
        covered.store(offset, at: 0)
        covered.replaceSubrange(8..<24, with: bytes[16..<32])
        let slice = bytes[...]
        guard slice.load(at: 32) as UInt32 == CRC32C.checksum(covered[...]) else { return nil }
        return LastRecord(start: slice.load(at: 16), timestampNanoseconds: slice.load(at: 24))
    }

    /// Decodes the first 16 bytes of a slot: `.some(nil)` for no bytes, nil for damaged bytes.
    package static func decode(_ bytes: [UInt8]) -> (offset: UInt64?, Void)? {
        if bytes.isEmpty { return (nil, ()) }
        let slice = bytes[...]
        guard bytes.count == 16, slice.load(at: 0) as UInt32 == magic,
            slice.load(at: 4) as UInt32 == CRC32C.checksum(bytes[8..<16])
        else { return nil }
        return (slice.load(at: 8), ())
    }

    // MARK: Encoding

    /// The first 16 bytes of a slot.
    package static func encode(_ offset: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        bytes.store(magic, at: 0)
        bytes.store(offset, at: 8)
        bytes.store(CRC32C.checksum(bytes[8..<16]), at: 4)
        return bytes
    }

    /// Encodes a whole slot into `slot` (48 bytes), with no allocation: a consumer stores one per message.
    ///
    /// Without a record the 20 bytes after the offset are zeros, so that an earlier record can never be taken for
    /// this offset's.
    package static func encodeSlot(
        offset: UInt64,
        last: LastRecord?,
        generation: UInt64,
        into slot: UnsafeMutableRawBufferPointer
    ) {
        precondition(slot.count >= slotSize, "a position slot is \(slotSize) bytes")
        func put<T: FixedWidthInteger>(_ value: T, _ at: Int) {
            slot.storeBytes(of: value.littleEndian, toByteOffset: at, as: T.self)
        }
        put(magic, 0)
        put(offset, 8)
        put(CRC32C.checksum(UnsafeRawBufferPointer(rebasing: slot[8..<16])), 4)
        if let last {
            put(last.start, 16)
            put(last.timestampNanoseconds, 24)
            put(CRC32C.checksum(UnsafeRawBufferPointer(rebasing: slot[8..<32])), 32)
        } else {
            for index in 16..<36 { slot[index] = 0 }
        }
        put(generation, 36)
        put(CRC32C.checksum(UnsafeRawBufferPointer(rebasing: slot[8..<44])), 44)
    }

    // MARK: Writing

    /// Stores an offset through the descriptor: both slots, in one `pwrite` of 112 bytes at offset 0 (within a
    /// sector, so a power cut keeps it whole or not at all); with `synchronize`, flushed before it returns.
    ///
    /// Both slots, so that a position moved back (a consumer starting over after a power cut) replaces the newer one.
    package func write(_ offset: UInt64, last: LastRecord? = nil, synchronize: Bool = false) throws(WormholeError) {
        try writer.withLock { (state) throws(WormholeError) in
            try write(offset, last: last, synchronize: synchronize, state: &state)
        }
    }

    private func write(
        _ offset: UInt64,
        last: LastRecord?,
        synchronize: Bool,
        state: inout WriterState
    ) throws(WormholeError) {
        state.generation += 1
        var bytes = [UInt8](repeating: 0, count: Self.fileSize)
        bytes.withUnsafeMutableBytes { file in
            Self.encodeSlot(offset: offset, last: last, generation: state.generation, into: file)
            Self.encodeSlot(
                offset: offset,
                last: last,
                generation: state.generation,
                into: UnsafeMutableRawBufferPointer(rebasing: file[Self.secondSlot...])
            )
        }
        var result = Descriptor(rawValue: descriptor).write(bytes, at: 0)
        if case .success = result, synchronize { result = Descriptor(rawValue: descriptor).synchronize() }
        if case .failure(let errno) = result {
            throw WormholeError.fileSystem(errno, "store the position of consumer \(name)", path: path)
        }
        state.newestSlot = 1
        state.lastWrite = .now
    }

    /// Stores an offset through the shared mapping, into the slot that does not hold the newest one: no system call,
    /// and a process killed mid-store leaves the other slot whole. The first store, and one a second or more after the
    /// last write through the descriptor, are written through it instead (the first also maps the file, once whole).
    package func store(_ offset: UInt64, last: LastRecord?) throws(WormholeError) {
        try writer.withLock { (state) throws(WormholeError) in
            guard let mapping = state.mapping, Self.storesThroughMapping.load(ordering: .relaxed),
                ContinuousClock.now - state.lastWrite < Self.writeInterval
            else {
                try write(offset, last: last, synchronize: false, state: &state)
                if state.mapping == nil { state.mapping = map() }
                return
            }
            let slot = 1 - state.newestSlot
            state.generation += 1
            Self.encodeSlot(
                offset: offset,
                last: last,
                generation: state.generation,
                into: UnsafeMutableRawBufferPointer(start: mapping + slot * Self.secondSlot, count: Self.slotSize)
            )
            state.newestSlot = slot
        }
    }

    /// Maps the file for stores, or nil where it cannot be (the stores then go through the descriptor).
    private func map() -> UnsafeMutableRawPointer? {
        let mapping = mmap(nil, Self.fileSize, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0)
        guard let mapping, mapping != UnsafeMutableRawPointer(bitPattern: -1) else { return nil }
        return mapping
    }

    /// Flushes the stored position to the disk.
    package func synchronize() throws(WormholeError) {
        if case .failure(let errno) = Descriptor(rawValue: descriptor).synchronize() {
            throw WormholeError.fileSystem(errno, "flush the position of consumer \(name)", path: path)
        }
    }

    /// When the position was last written through the descriptor: how recently the consumer was seen.
    package var lastWritten: Date? {
        guard case .success(let status) = Descriptor(rawValue: descriptor).status(), status.size > 0 else { return nil }
        return Date(timeIntervalSince1970: status.modificationTime)
    }
}
