import Foundation
import Testing

@testable import WormholeKit

/// A consumer's position file: written to its three slots, stored through a shared mapping into the second and third
/// in turn, the newest whole slot read back, and files of the earlier formats still read.
@Suite("Queue consumer positions", .limit(minutes: 3))
struct QueuePositionTests {
    let directory = TemporaryDirectory()

    /// A slot's 48 bytes.
    static func slot(_ offset: UInt64, generation: UInt64, last: QueueCursorFile.LastRecord? = nil) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: QueueCursorFile.slotSize)
        bytes.withUnsafeMutableBytes {
            QueueCursorFile.encodeSlot(offset: offset, last: last, generation: generation, into: $0)
        }
        return bytes
    }

    /// A file of three slots.
    static func file(_ slots: [UInt8]...) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: QueueCursorFile.fileSize)
        for (index, slot) in slots.enumerated() {
            let start = index * QueueCursorFile.slotStride
            bytes.replaceSubrange(start..<start + slot.count, with: slot)
        }
        return bytes
    }

    static func offset(_ bytes: [UInt8]) -> UInt64? {
        if case .position(let slot) = QueueCursorFile.decodeFile(bytes) { return slot.offset }
        return nil
    }

    @Test("The newest whole slot wins; a torn one gives way to another; files of the earlier formats still read")
    func slotRules() {
        let written = Self.slot(100, generation: 4)
        let older = Self.slot(164, generation: 5)
        let newer = Self.slot(228, generation: 6)
        #expect(Self.offset(Self.file(written, older, newer)) == 228)
        #expect(Self.offset(Self.file(written, newer, older)) == 228)
        // A position moved back is written to every slot with a newer generation: it replaces them all.
        let back = Self.slot(0, generation: 7)
        #expect(Self.offset(Self.file(back, back, back)) == 0)
        // Any one byte of the file damaged: the newest slot still whole wins. A first slot whose last bytes no longer
        // check reads as an older version's write, and wins: its own offset, never one that was not stored.
        let whole = Self.file(written, older, newer)
        for index in 0..<whole.count {
            var damaged = whole
            damaged[index] ^= 0x5A
            let expected: UInt64 =
                switch index {
                case 16..<QueueCursorFile.slotSize: 100
                case (2 * QueueCursorFile.slotStride)..<(2 * QueueCursorFile.slotStride + QueueCursorFile.slotSize): 164
                default: 228
                }
            #expect(Self.offset(damaged) == expected, "a byte damaged at \(index)")
        }
        // An older version writes 16 or 36 bytes at offset 0, without a generation: what it wrote last wins, even
        // below the positions stored after it by this version (it read its own first slot, which lags).
        var oldWriter = whole
        oldWriter.replaceSubrange(0..<16, with: QueueCursorFile.encode(132))
        #expect(Self.offset(oldWriter) == 132)
        // The formats before: 16 bytes, and 36 bytes naming the record.
        #expect(Self.offset(QueueCursorFile.encode(64)) == 64)
        let named = Array(Self.slot(64, generation: 1, last: .init(start: 0, timestampNanoseconds: 9)).prefix(36))
        #expect(
            QueueCursorFile.decodeFile(named)
                == .position(.init(offset: 64, last: .init(start: 0, timestampNanoseconds: 9), generation: nil))
        )
        #expect(QueueCursorFile.decodeFile([]) == .empty)
        #expect(QueueCursorFile.decodeFile(Array("damaged".utf8)) == .damaged)
        // The other slots count only whole: zeros there never stand for a position.
        let noise = [UInt8](repeating: 7, count: QueueCursorFile.slotSize)
        #expect(QueueCursorFile.decodeFile(Self.file(noise, [], newer)) == .position(.init(offset: 228, generation: 6)))
        #expect(QueueCursorFile.decodeFile(Self.file(noise)) == .damaged)
    }

    @Test(
        "Stores go into the second and third slots where the file system allows, seen by readers at once; a second on, a write"
    )
    func storesReachOtherReaders() async throws {
        try await offThePool {
            let path = directory("stores")
            let queue = try Wormhole(directory: path).queue("jobs")
            try queue.enqueue(contentsOf: Array(0..<6))
            let cursor = try #require(try queue.log.openCursor(consumer: "c") as? DirectoryQueueCursor)
            let file = URL(fileURLWithPath: path + "/jobs.consumers/c")
            func slots() throws -> [UInt64?] {
                let bytes = Array(try Data(contentsOf: file))
                return (0..<3).map { index in
                    let start = index * QueueCursorFile.slotStride
                    return QueueCursorFile.decodeSlot(bytes[start..<start + QueueCursorFile.slotSize])?.offset
                }
            }
            var batch = try cursor.read(maximumCount: 1)
            var ends: [UInt64] = []
            let started = ContinuousClock.now
            while let last = batch.last, ends.count < 5 {
                ends.append(last.end)
                batch = try cursor.acknowledge(through: last.end, thenRead: 1)
                // Another reader of the file (the queue's status, another process) sees each position at once.
                #expect(try queue.status().consumers.first?.offset == last.end)
            }
            #expect(ends.count == 5)
            if cursor.file.storesThroughItsMapping {
                // The first position was written to every slot; the next ones were stored in the second and third in
                // turn (unless a second went by, which makes a store a write).
                if ContinuousClock.now - started < .milliseconds(900) {
                    #expect(try slots() == [ends[0], ends[3], ends[4]])
                }
            } else {
                // Darwin, and file systems that do not write in place: every position is written.
                #expect(try slots() == [ends[4], ends[4], ends[4]])
            }
            let attributes = try FileManager.default.attributesOfItem(atPath: file.path)
            let writtenAt = try #require(attributes[.modificationDate] as? Date)
            Thread.sleep(forTimeInterval: 1.2)
            let last = try #require(batch.last)
            _ = try cursor.acknowledge(through: last.end, thenRead: 1)
            #expect(try slots() == [last.end, last.end, last.end])
            let rewritten = try FileManager.default.attributesOfItem(atPath: file.path)[.modificationDate] as? Date
            #expect(rewritten.map { $0 > writtenAt } == true)
        }
    }

    @Test(
        "A consumer started again goes on with newer generations than its file's, and a store torn mid-way costs one message"
    )
    func generationsAndTornStores() async throws {
        try await offThePool {
            let path = directory("generations")
            let queue = try Wormhole(directory: path).queue("jobs")
            try queue.enqueue(contentsOf: Array(0..<4))
            let records = try queue.log.openCursor(consumer: "probe").read(maximumCount: 4)
            // What an earlier process left: written at the first record, stored at the second with a high generation,
            // and the third stored torn (the process was killed in the middle of that store).
            var torn = Self.slot(records[2].end, generation: 42)
            torn[12] ^= 0xFF
            let left = Self.file(
                Self.slot(records[0].end, generation: 40),
                Self.slot(records[1].end, generation: 41),
                torn
            )
            try Data(left).write(to: URL(fileURLWithPath: path + "/jobs.consumers/c"))
            var cursor: (any QueueCursor)? = try queue.log.openCursor(consumer: "c")
            let again = try cursor!.read(maximumCount: 1)
            #expect(try again.map { try JSONDecoder().decode(Int.self, from: $0.payload) } == [2])
            // Its stores count as newer than every slot the earlier process left.
            _ = try cursor!.acknowledge(through: again[0].end, thenRead: 1)
            _ = try cursor!.acknowledge(through: records[3].end, thenRead: 1)
            #expect(try queue.status().consumers.first?.offset == records[3].end)
            // The cursor gone, its last position is written: the first slot, all an older version reads, has it.
            cursor = nil
            let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: path + "/jobs.consumers/c")))
            #expect(QueueCursorFile.decodeSlot(bytes[0..<QueueCursorFile.slotSize])?.offset == records[3].end)
            guard case .position(let newest) = QueueCursorFile.decodeFile(bytes) else {
                Issue.record("the position file does not decode")
                return
            }
            #expect((newest.generation ?? 0) > 42, "\(newest)")
            let after = try queue.log.openCursor(consumer: "c").read(maximumCount: 4)
            #expect(after.isEmpty)
        }
    }
}
