import Foundation
import Testing

@testable import WormholeKit

/// A consumer's position file: two slots filled in turn through a shared mapping, the newer whole one read back, and
/// files of the earlier formats still read.
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

    /// A file of two slots.
    static func file(_ first: [UInt8], _ second: [UInt8]) -> [UInt8] {
        first + [UInt8](repeating: 0, count: QueueCursorFile.secondSlot - first.count) + second
    }

    static func offset(_ bytes: [UInt8]) -> UInt64? {
        if case .position(let slot) = QueueCursorFile.decodeFile(bytes) { return slot.offset }
        return nil
    }

    @Test("The newer whole slot wins; a torn one gives way to the other; files of the earlier formats still read")
    func slotRules() {
        let older = Self.slot(100, generation: 4)
        let newer = Self.slot(164, generation: 5)
        #expect(Self.offset(Self.file(older, newer)) == 164)
        #expect(Self.offset(Self.file(newer, older)) == 164)
        // A store cut short (a process killed mid-store) leaves its slot torn: the other one is read.
        for torn in [4, 9, 40, 45] {
            var cut = newer
            cut[torn] ^= 0x5A
            #expect(Self.offset(Self.file(older, cut)) == 100, "a byte torn at \(torn)")
            // In the first slot, a store cut after its offset (in the generation) leaves the newest offset whole.
            #expect(Self.offset(Self.file(cut, older)) == (torn < 36 ? 100 : 164), "a byte torn at \(torn)")
        }
        // An older writer (16 or 36 bytes at offset 0) over a file of two slots: its slot has no generation and wins.
        var oldWriter = Self.file(older, newer)
        oldWriter.replaceSubrange(0..<16, with: QueueCursorFile.encode(228))
        #expect(Self.offset(oldWriter) == 228)
        // The formats before: 16 bytes, and 36 bytes naming the record.
        #expect(Self.offset(QueueCursorFile.encode(64)) == 64)
        let named = Array(Self.slot(64, generation: 1, last: .init(start: 0, timestampNanoseconds: 9)).prefix(36))
        #expect(
            QueueCursorFile.decodeFile(named)
                == .position(.init(offset: 64, last: .init(start: 0, timestampNanoseconds: 9), generation: nil))
        )
        #expect(QueueCursorFile.decodeFile([]) == .empty)
        #expect(QueueCursorFile.decodeFile(Array("damaged".utf8)) == .damaged)
        // The second slot alone counts only whole: zeros there never stand for a position.
        #expect(
            QueueCursorFile.decodeFile(Self.file([UInt8](repeating: 7, count: 48), newer))
                == .position(
                    .init(offset: 164, last: nil, generation: 5)
                )
        )
        #expect(
            QueueCursorFile.decodeFile([UInt8](repeating: 7, count: 48) + [UInt8](repeating: 0, count: 64)) == .damaged
        )
    }

    @Test("Positions stored through the mapping are what other readers see; a second on, a store writes both slots")
    func storesReachOtherReaders() async throws {
        try await offThePool {
            let path = directory("stores")
            let queue = try Wormhole(directory: path).queue("jobs")
            try queue.enqueue(contentsOf: Array(0..<6))
            let cursor = try queue.log.openCursor(consumer: "c")
            let file = URL(fileURLWithPath: path + "/jobs.consumers/c")
            func slots() throws -> [UInt64?] {
                let bytes = Array(try Data(contentsOf: file))
                return [
                    QueueCursorFile.decodeSlot(bytes[0..<QueueCursorFile.slotSize])?.offset,
                    QueueCursorFile.decodeSlot(bytes[QueueCursorFile.secondSlot...])?.offset,
                ]
            }
            var batch = try cursor.read(maximumCount: 1)
            var ends: [UInt64] = []
            while let last = batch.last, ends.count < 5 {
                ends.append(last.end)
                batch = try cursor.acknowledge(through: last.end, thenRead: 1)
                // Another reader of the file (the queue's status, another process) sees each position at once.
                #expect(try queue.status().consumers.first?.offset == last.end)
            }
            #expect(ends.count == 5)
            // The first store was written (both slots), the next ones stored in one slot, then the other.
            #expect(try slots() == [ends[3], ends[4]])
            let written = try #require(try FileManager.default.attributesOfItem(atPath: file.path)[.modificationDate] as? Date)
            Thread.sleep(forTimeInterval: 1.2)
            let last = try #require(batch.last)
            _ = try cursor.acknowledge(through: last.end, thenRead: 1)
            #expect(try slots() == [last.end, last.end])
            let rewritten = try FileManager.default.attributesOfItem(atPath: file.path)[.modificationDate] as? Date
            #expect(rewritten.map { $0 > written } == true)
        }
    }

    @Test("A store torn in its slot: the consumer comes back one message early, never past one")
    func tornStore() async throws {
        try await offThePool {
            let path = directory("torn")
            let queue = try Wormhole(directory: path).queue("jobs")
            try queue.enqueue(contentsOf: Array(0..<3))
            let records = try queue.log.openCursor(consumer: "probe").read(maximumCount: 3)
            // The file a consumer killed in the middle of storing its third position leaves: the second slot holds
            // the first message's end, and the first slot, being stored with the second's, is torn.
            var torn = Self.slot(records[1].end, generation: 3)
            torn[12] ^= 0xFF
            let file = Self.file(torn, Self.slot(records[0].end, generation: 2))
            try Data(file).write(to: URL(fileURLWithPath: path + "/jobs.consumers/c"))
            let after = try queue.log.openCursor(consumer: "c").read(maximumCount: 3)
            #expect(try after.map { try JSONDecoder().decode(Int.self, from: $0.payload) } == [1, 2])
        }
    }
}
