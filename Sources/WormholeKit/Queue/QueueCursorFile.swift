import CWormholeSystem
import Foundation
import Synchronization

/// A consumer's stored position, in three slots of 48 bytes, at offsets 0, 64 and 128.
///
/// A slot begins as the first format did: 16 bytes, `WHQC`, a CRC-32C of the offset, the offset (little-endian);
/// then 20 optional bytes that name the record ending at the offset (its start and timestamp, with a CRC-32C that
/// covers the offset too), so that a position the log no longer backs is recognised; then a generation and a CRC-32C of
/// bytes 8–43, which tell the newest slot. `FORMAT.md` gives the rules.
///
/// A position is *written* to every slot with one `pwrite`, or *stored* through a shared mapping of the file into the
/// second or third slot, in turn (the one not holding the newest): a store to memory that outlives the process, where
/// a `pwrite` costs a system call per message, and a process killed in the middle of it leaves that slot torn and the
/// other whole. The first slot is only ever written, so that an older version, which reads that slot alone, never
/// finds it torn.
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
        /// Which slot is newest; nil in a first slot that an older version wrote (or one whose last bytes do not
        /// check).
        package var generation: UInt64?
    }

    /// What a position file holds.
    package enum Contents: Equatable, Sendable {
        /// No position yet: a consumer being created.
        case empty
        /// The newest whole slot.
        case position(Slot)
        /// No slot is whole.
        case damaged
    }

    private static let magic: UInt32 = 0x4351_4857  // "WHQC"
    /// The bytes of one slot, and the distance from one slot to the next.
    package static let slotSize = 48
    package static let slotStride = 64
    /// The file: three slots.
    package static let fileSize = 2 * slotStride + slotSize
    /// How long stores through the mapping may go on after the last write, in nanoseconds: the file's modification
    /// time, which a write always moves (a store only now and then), tells how recently the consumer was seen.
    private static let writeInterval: UInt64 = 1_000_000_000
    /// The file systems on which positions are stored through a mapping (``MappedFiles/fileSystemsWrittenInPlace``:
    /// a store to a page written before needs no new blocks). On others, and on Darwin, whose `fsync` is not
    /// documented to flush pages dirtied through a mapping, every position is written.
    private static let fileSystemsForStores = MappedFiles.fileSystemsWrittenInPlace

    /// Whether consumers may store positions through a mapping. The power-loss explorer turns it off in the
    /// workloads it traces, since it sees system calls and not stores to memory; the rules for the slots that stores
    /// fill are checked by the tests of torn slots and by the crash test, whose processes are killed mid-store.
    package static let storesThroughMapping = Atomic<Bool>(true)

    /// The writer's side: used by one cursor at a time, under this lock (uncontended).
    private struct WriterState {
        /// The newest generation this process wrote or read.
        var generation: UInt64 = 0
        /// The slot the next store goes into: 1 or 2.
        var nextSlot = 1
        /// The file mapped, once a write made it whole; nil where stores are not used.
        var mapping: UnsafeMutableRawPointer?
        /// Whether mapping was tried (it is tried once).
        var mappingTried = false
        /// When the position was last written through the descriptor.
        var lastWrite: UInt64 = 0
        /// The newest position stored through the mapping since the last write, written when the cursor goes.
        var unwritten: (offset: UInt64, last: LastRecord?)?
    }

    private let descriptor: Int32
    private let writer = Locked(WriterState())
    /// Whether ``takeForDropping()`` took the lock, and with it a permit that the close gives back.
    private let heldForDropping = Atomic<Bool>(false)
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
        Descriptor(rawValue: descriptor).close()  // and with it the lock of a reclaiming process
        if heldForDropping.load(ordering: .relaxed) { SuspensionGate.leave() }
    }

    // MARK: A consumer at work

    /// Marks the consumer as seen now: the file's modification time, which reclaiming reads before it drops a
    /// consumer not seen within the retention. Returns whether the file still has its name: false when reclaiming
    /// dropped it, and the consumer must make it again.
    ///
    /// No lock is kept: iOS ends a suspended app that holds a file lock in a shared container (`0xdead10cc`), and a
    /// cursor waits on a quiet queue for days. A shared `flock` is held for the few calls of the mark only, so that
    /// it cannot fall between a reclaiming process's check of the time and its removal of the file (which that
    /// process makes under the exclusive lock, ``takeForDropping()``). A running cursor marks itself every quarter of
    /// the retention (``DirectoryQueueCursor``), so only a consumer whose process was away (stopped, suspended, gone)
    /// for most of the retention can be dropped.
    ///
    /// With a `limit`, waits that long at most for a reclaiming process that decides, and throws
    /// ``WormholeError/Code/timedOut`` when it is stuck; without one, a lock held at this moment skips the mark.
    ///
    /// While the process is suspended (``SuspensionGate``) no lock is taken: with a `limit` it throws
    /// ``WormholeError/Code/suspended``; without one the mark is skipped.
    package func markSeen(waitingAtMost limit: Duration?) throws(WormholeError) -> Bool {
        guard SuspensionGate.enter() else {
            if limit == nil { return true }
            throw WormholeError.suspended("mark the consumer \(name) as seen", path: path)
        }
        defer { SuspensionGate.leave() }
        let file = Descriptor(rawValue: descriptor)
        var locked = false
        if let limit {
            do throws(WormholeError) {
                try file.lock(
                    exclusive: false,
                    waitingAtMost: limit,
                    toDo: "open the consumer (a process reclaiming the queue's space holds its file)",
                    path: path
                )
                locked = true
            } catch {
                // A lock that cannot be had at all (a file system without `flock`) leaves the mark unguarded; a stuck
                // reclaimer is an error, and so is a suspension that came during the wait.
                if error.code == .timedOut || error.code == .suspended { throw error }
            }
        } else {
            guard file.tryLockShared() else { return true }
            locked = true
        }
        defer { if locked { file.unlock() } }
        _ = futimens(descriptor, nil)  // both times to now; a failure leaves the last write's time, which is older
        guard case .success(let status) = file.status() else { return true }
        return status.linkCount > 0
    }

    /// How long opening a consumer waits for a reclaiming process that holds its file's lock: it holds it only while
    /// it decides whether to drop the file.
    static let reclaimingWaitLimit = Duration.seconds(5)

    /// Takes the exclusive lock for a reclaiming process that is about to drop this consumer: true when taken (kept
    /// until this value is released, so that no mark falls between the caller's last check and the removal), false
    /// when a consumer is marking itself at this moment.
    ///
    /// The lock's permit (``SuspensionGate``) is held as long: a suspended process drops nothing.
    package func takeForDropping() -> Bool {
        guard SuspensionGate.enter() else { return false }
        let taken = (try? Descriptor(rawValue: descriptor).tryLockExclusive().get()) == true
        // One permit for the file, however often it is taken (a second take finds the lock this file's already).
        if !taken || heldForDropping.exchange(true, ordering: .relaxed) { SuspensionGate.leave() }
        return taken
    }

    // MARK: Reading

    /// The stored offset, or nil for a consumer that has not handled anything yet.
    package func read() throws(WormholeError) -> UInt64? {
        try readWithLastRecord()?.offset
    }

    /// The stored offset and, when stored with it, the record it ends.
    package func readWithLastRecord() throws(WormholeError) -> (offset: UInt64, last: LastRecord?)? {
        // A slot being stored reads as torn, and another one is whole; all of them can read torn only while a write
        // replaces them together: read again, after a pause.
        for attempt in 1...3 {
            let bytes: [UInt8]
            switch Descriptor(rawValue: descriptor).read(count: Self.fileSize, at: 0) {
            case .success(let read): bytes = read
            case .failure(let errno):
                throw WormholeError.fileSystem(errno, "read the position of consumer \(name)", path: path)
            }
            switch Self.decodeFile(bytes) {
            case .empty: return nil
            case .position(let slot):
                // The generations go on from the file's: a later store must count as newer than every slot.
                if let generation = slot.generation {
                    writer.withLock { $0.generation = max($0.generation, generation) }
                }
                return (slot.offset, slot.last)
            case .damaged where attempt < 3:
                usleep(1_000)
            case .damaged:
                break
            }
        }
        throw WormholeError(
            .corruptMessage,
            "The position of consumer \(name) is damaged. Remove the file to start that consumer over from the "
                + "oldest message kept.",
            path: path
        )
    }

    /// Decodes a position file: its newest whole slot.
    package static func decodeFile(_ bytes: [UInt8]) -> Contents {
        if bytes.isEmpty { return .empty }
        let first = decodeSlot(bytes[0..<min(bytes.count, slotSize)])
        // An older version writes the first slot alone, without a generation: what it wrote last is its newest.
        if let first, first.generation == nil { return .position(first) }
        var newest = first
        // The second and third slots count only whole, generation and all.
        for start in [slotStride, 2 * slotStride] where bytes.count >= start + slotSize {
            guard let slot = decodeSlot(bytes[start..<start + slotSize]), let generation = slot.generation else {
                continue
            }
            if let known = newest?.generation, known >= generation { continue }
            newest = slot
        }
        return newest.map { .position($0) } ?? .damaged
    }

    /// One slot: nil unless its first 16 bytes are whole.
    package static func decodeSlot(_ slot: ArraySlice<UInt8>) -> Slot? {
        let bytes = Array(slot)
        guard bytes.count >= 16, let offset = decode(Array(bytes[0..<16]))?.offset else { return nil }
        var result = Slot(offset: offset, last: decodeLastRecord(bytes, offset: offset), generation: nil)
        if bytes.count >= slotSize {
            let checksum = bytes.withUnsafeBytes { CRC32C.checksum(UnsafeRawBufferPointer(rebasing: $0[8..<44])) }
            if bytes[...].load(at: 44) as UInt32 == checksum {
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
        // The three checksums cover bytes 8 to 16, 32 and 44: each continues the one before, so that every byte is
        // checksummed once.
        func checksum(_ range: Range<Int>, continuing crc: UInt32 = 0) -> UInt32 {
            CRC32C.checksum(UnsafeRawBufferPointer(rebasing: slot[range]), continuing: crc)
        }
        put(magic, 0)
        put(offset, 8)
        var crc = checksum(8..<16)
        put(crc, 4)
        if let last {
            put(last.start, 16)
            put(last.timestampNanoseconds, 24)
            crc = checksum(16..<32, continuing: crc)
            put(crc, 32)
            put(generation, 36)
            crc = checksum(32..<44, continuing: crc)
        } else {
            for index in 16..<36 { slot[index] = 0 }
            put(generation, 36)
            crc = checksum(16..<44, continuing: crc)
        }
        put(crc, 44)
    }

    // MARK: Writing

    /// Writes an offset to every slot, with one `pwrite` of 176 bytes at offset 0 (within a sector, so a power cut
    /// keeps it whole or not at all); with `synchronize`, flushed before it returns.
    ///
    /// Every slot, so that a position moved back (a consumer starting over after a power cut) replaces newer ones.
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
        let generation = state.generation + 1
        var bytes = [UInt8](repeating: 0, count: Self.fileSize)
        bytes.withUnsafeMutableBytes { file in
            for start in [0, Self.slotStride, 2 * Self.slotStride] {
                Self.encodeSlot(
                    offset: offset,
                    last: last,
                    generation: generation,
                    into: UnsafeMutableRawBufferPointer(rebasing: file[start..<start + Self.slotSize])
                )
            }
        }
        var result = Descriptor(rawValue: descriptor).write(bytes, at: 0)
        if case .success = result, synchronize { result = Descriptor(rawValue: descriptor).synchronize() }
        if case .failure(let errno) = result {
            throw WormholeError.fileSystem(errno, "store the position of consumer \(name)", path: path)
        }
        state.generation = generation
        state.lastWrite = ProcessFacts.coarseMonotonicNanoseconds()
        state.unwritten = nil
    }

    /// Stores an offset through the shared mapping, into the second or third slot, whichever does not hold the
    /// newest: no system call, and a process killed mid-store leaves the other whole. The first store of a process,
    /// one a second or more after the last write, and every one where stores are not used, are written instead.
    package func store(_ offset: UInt64, last: LastRecord?) throws(WormholeError) {
        try writer.withLock { (state) throws(WormholeError) in
            guard let mapping = state.mapping,
                ProcessFacts.coarseMonotonicNanoseconds() &- state.lastWrite < Self.writeInterval
            else {
                try write(offset, last: last, synchronize: false, state: &state)
                if !state.mappingTried, Self.storesThroughMapping.load(ordering: .relaxed) {
                    state.mappingTried = true
                    state.mapping = map()
                }
                return
            }
            state.generation += 1
            Self.encodeSlot(
                offset: offset,
                last: last,
                generation: state.generation,
                into: UnsafeMutableRawBufferPointer(
                    start: mapping + state.nextSlot * Self.slotStride,
                    count: Self.slotSize
                )
            )
            state.nextSlot = 3 - state.nextSlot
            state.unwritten = (offset, last)
        }
    }

    /// Writes the newest position if it was only stored since the last write: when a consumer's cursor goes, so that
    /// the first slot (all an older version reads) and the modification time catch up with it.
    package func writeStored() throws(WormholeError) {
        try writer.withLock { (state) throws(WormholeError) in
            guard let (offset, last) = state.unwritten else { return }
            try write(offset, last: last, synchronize: false, state: &state)
        }
    }

    /// Whether stores go through a mapping of the file (after the first store): for tests.
    package var storesThroughItsMapping: Bool { writer.withLock { $0.mapping != nil } }

    /// Maps the file for stores, or nil where stores are not used (the positions are then written).
    private func map() -> UnsafeMutableRawPointer? {
        #if os(Linux)
        guard Self.fileSystemsForStores.contains(cwormhole_file_system_type(descriptor)) else { return nil }
        let mapping = mmap(nil, Self.fileSize, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0)
        guard let mapping, mapping != UnsafeMutableRawPointer(bitPattern: -1) else { return nil }
        return mapping
        #else
        return nil
        #endif
    }

    /// Flushes the stored position to the disk.
    package func synchronize() throws(WormholeError) {
        if case .failure(let errno) = Descriptor(rawValue: descriptor).synchronize() {
            throw WormholeError.fileSystem(errno, "flush the position of consumer \(name)", path: path)
        }
    }

    /// The file's modification time, which every write moves (a store through the mapping only now and then): how
    /// recently the consumer was seen, to within a second of its last acknowledgement.
    package var lastWritten: Date? {
        guard case .success(let status) = Descriptor(rawValue: descriptor).status(), status.size > 0 else { return nil }
        return Date(timeIntervalSince1970: status.modificationTime)
    }
}
