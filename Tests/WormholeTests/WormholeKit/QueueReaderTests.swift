import Foundation
import Testing
import WormholeCrashStates

@testable import WormholeKit

/// The queue reader on logs written by hand: whole records, records torn at every length, records longer than a read.
@Suite("Queue reader", .limit(minutes: 3))
struct QueueReaderTests {
    let directory = TemporaryDirectory()

    /// The offsets of the records a reader delivers from the start of `log`, until it has nothing whole.
    func delivered(_ log: [UInt8], name: String) throws -> [UInt64] {
        let path = directory(name)
        #expect(FileManager.default.createFile(atPath: path, contents: Data(log)))
        let descriptor = open(path, O_RDONLY)
        try #require(descriptor >= 0)
        defer { close(descriptor) }
        var reader = QueueReader(descriptor: descriptor, position: 0)
        var offsets: [UInt64] = []
        while let item = try reader.next() {
            offsets.append(item.offset)
            reader.advance(to: item.end)
            try #require(offsets.count <= log.count)
        }
        return offsets
    }

    @Test("Every whole record, in order, none torn: of any size, torn at any length, across reads", arguments: 0..<24)
    func randomLogs(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)  // a seed, so that a failing log can be made again
        var log: [UInt8] = []
        var whole: [UInt64] = []
        for _ in 0..<40 {
            // Mostly small records, some longer than one read of the reader (256 KiB).
            let size =
                Int.random(in: 0..<5, using: &random) == 0
                ? Int.random(in: 22...600_000, using: &random) : Int.random(in: 22...300, using: &random)
            let record = QueueTests.record(size: size, fill: UInt8.random(in: 0x61...0x7A, using: &random))
            if Int.random(in: 0..<3, using: &random) == 0 {
                log += record.prefix(Int.random(in: 1..<size, using: &random))
            } else {
                whole.append(UInt64(log.count))
                log += record
            }
        }
        // A whole record last, so that every torn one has one after it.
        whole.append(UInt64(log.count))
        log += QueueTests.record(size: 40)
        #expect(try delivered(log, name: "log-\(seed)") == whole)
    }

    @Test("A record the log ends inside is waited for, unless a whole record follows it")
    func unfinishedAtTheEnd() throws {
        let first = QueueTests.record(size: 30)
        let large = QueueTests.record(size: 2000)
        #expect(try delivered(first + large.prefix(100), name: "a") == [0])
        #expect(try delivered(first + large.prefix(1999), name: "b") == [0])
        // A header cut short, or only its magic.
        #expect(try delivered(first + large.prefix(11), name: "c") == [0])
        #expect(try delivered(first + large.prefix(4), name: "d") == [0])
        // The start of a record that is not whole yet proves nothing: it may be the waiting record's own payload.
        let second = UInt64(first.count + 100)
        #expect(try delivered(first + large.prefix(100) + large.prefix(50), name: "e") == [0])
        #expect(try delivered(first + large.prefix(100) + first, name: "f") == [0, second])
        #expect(try delivered(first + large.prefix(100) + large.prefix(50) + first, name: "g") == [0, second + 50])
    }

    @Test("The reader's rule on bytes: torn, unfinished, no record, and a header cut by the end of a read")
    func steps() {
        let first = QueueTests.record(size: 30)
        let large = QueueTests.record(size: 2000)
        func step(_ bytes: [UInt8], at offset: Int = 0, reachesEnd: Bool = true) -> QueueFormat.Step {
            bytes.withUnsafeBytes { QueueFormat.step($0, at: offset, reachesEnd: reachesEnd) }
        }
        #expect(step(Array(large.prefix(100))) == .wait)
        #expect(step(Array(large.prefix(100)), reachesEnd: false) == .read(count: 2000))
        #expect(step(Array(large.prefix(100)) + first) == .resume(at: 100))
        // A damaged record before one that runs past the bytes: read that one whole.
        #expect(step([0x57] + Array(large.prefix(100)), reachesEnd: false) == .resume(at: 1))
        let zeros = [UInt8](repeating: 0, count: 1000)
        #expect(step(zeros, reachesEnd: false) == .nothingBefore(1000 - 11))
        #expect(step(zeros) == .wait)
        // 8 bytes of something that is no header, at the end of a read: its length is not trusted.
        #expect(step([0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF], reachesEnd: false) == .read(count: 12))
    }
}
