import Foundation
import Testing

@testable import WormholeKit

@Suite("Mailbox file format")
struct MailboxFormatTests {
    let header = MailboxFormat.Header(slotCapacity: 512, generation: 42)
    let record = MailboxFormat.Record(
        sequence: 7,
        timestampNanoseconds: 1_700_000_000_000_000_000,
        isCleared: false,
        sender: Array("app[1]".utf8),
        payload: Array(#"{"number":1}"#.utf8)
    )

    func decode(_ bytes: [UInt8]) throws -> Result<MailboxFormat.Contents, MailboxFormat.FileProblem> {
        try MailboxFormat.decodeFile(size: bytes.count) { (count, offset) throws(WormholeError) in
            Array(bytes[min(offset, bytes.count)..<min(offset + count, bytes.count)])
        }
    }

    @Test("A file round-trips its header and newest record")
    func roundTrip() throws {
        let file = MailboxFormat.encodeFile(header: header, record: record)
        #expect(file.count == header.fileSize)
        let contents = try decode(file).get()
        #expect(contents.header == header)
        #expect(contents.newest?.slot == 0)
        #expect(contents.newest?.record == record)
    }

    @Test("The newest valid slot wins; a torn newer slot falls back to the older whole one")
    func newestValidSlotWins() throws {
        var file = MailboxFormat.encodeFile(header: header, record: record)
        var newer = record
        newer.sequence = 8
        newer.payload = Array(#"{"number":2}"#.utf8)
        let encoded = MailboxFormat.encodeRecord(newer)
        file.replaceSubrange(header.slotOffset(1)..<header.slotOffset(1) + encoded.count, with: encoded)
        #expect(try decode(file).get().newest?.record == newer)
        // Tear the newer record (a write under way): the reader keeps the previous message.
        file[header.slotOffset(1) + encoded.count - 1] ^= 0xFF
        #expect(try decode(file).get().newest?.record == record)
    }

    @Test("A file over 64 KiB, read head by head and record by record, follows the same rules")
    func largeFile() throws {
        let large = MailboxFormat.Header(slotCapacity: 64 * 1024, generation: 42)
        var file = MailboxFormat.encodeFile(header: large, record: record)
        #expect(file.count > MailboxFormat.wholeReadLimit)
        #expect(try decode(file).get().newest?.record == record)
        var newer = record
        newer.sequence = 8
        newer.payload = Array(repeating: 0x42, count: 40_000)
        let encoded = MailboxFormat.encodeRecord(newer)
        file.replaceSubrange(large.slotOffset(1)..<large.slotOffset(1) + encoded.count, with: encoded)
        let found = try decode(file).get().newest
        #expect(found?.slot == 1)
        #expect(found?.record == newer)
        // A torn newer record falls back to the older one; with both torn, there is no message to read.
        file[large.slotOffset(1) + encoded.count - 1] ^= 0xFF
        #expect(try decode(file).get().newest?.record == record)
        file[large.slotOffset(0) + 40] ^= 0xFF
        #expect(try decode(file).failureValue == .noValidRecord)
        // Cut short of its slots; and a file whose slots are both empty.
        let cut = try decode(Array(MailboxFormat.encodeFile(header: large, record: record).dropLast()))
        #expect(cut.failureValue == .truncated(size: large.fileSize - 1, expected: large.fileSize))
        let empty = try decode(MailboxFormat.encodeEmptyFile(header: large)).get()
        #expect(empty.header == large)
        #expect(empty.newest == nil)
    }

    @Test("Two whole records of one sequence: slot 0's is read")
    func equalSequences() throws {
        var file = MailboxFormat.encodeFile(header: header, record: record)
        var twin = record
        twin.payload = Array("twin".utf8)
        let encoded = MailboxFormat.encodeRecord(twin)
        file.replaceSubrange(header.slotOffset(1)..<header.slotOffset(1) + encoded.count, with: encoded)
        #expect(try decode(file).get().newest?.slot == 0)
    }

    @Test("A file that shrinks between its size and its read gives an error, small or large")
    func shrinksWhileRead() throws {
        for capacity in [512, 64 * 1024] {
            let header = MailboxFormat.Header(slotCapacity: capacity, generation: 42)
            let file = MailboxFormat.encodeFile(header: header, record: record)
            // The size says whole; the read ends inside slot 0's record, or before slot 1.
            for kept in [MailboxFormat.headerSize + 20, header.slotOffset(1) - 1] {
                let result = try MailboxFormat.decodeFile(size: file.count) { (count, offset) throws(WormholeError) in
                    Array(file.prefix(kept)[min(offset, kept)..<min(offset + count, kept)])
                }
                if kept < MailboxFormat.headerSize + 50 {
                    #expect(result.failureValue == .noValidRecord, "capacity \(capacity), \(kept) bytes")
                } else {
                    #expect((try? result.get())?.newest?.record == record, "capacity \(capacity), \(kept) bytes")
                }
            }
        }
    }

    @Test("A file truncated at any byte is reported as truncated, never read wrong")
    func truncatedAtEveryByte() throws {
        let file = MailboxFormat.encodeFile(header: header, record: record)
        for length in 0..<file.count {
            let result = try decode(Array(file.prefix(length)))
            switch result {
            case .failure(.header(.truncated)), .failure(.truncated): continue
            default: Issue.record("length \(length) gave \(result)")
            }
        }
    }

    @Test("A wrong magic, an unknown version, a damaged header and huge lengths are caught")
    func damagedHeaders() throws {
        var file = MailboxFormat.encodeFile(header: header, record: record)
        var wrongMagic = file
        wrongMagic[0] = UInt8(ascii: "X")
        #expect(try decode(wrongMagic).failureValue == .header(.badMagic))

        var futureVersion = file
        futureVersion.store(UInt16(9), at: 4)
        #expect(try decode(futureVersion).failureValue == .header(.unsupportedVersion(9)))

        var flipped = file
        flipped[20] ^= 1
        #expect(try decode(flipped).failureValue == .header(.badChecksum))

        // A record claiming a payload far larger than its slot.
        file.store(UInt32.max, at: header.slotOffset(0) + 24)
        #expect(try decode(file).failureValue == .noValidRecord)
    }

    @Test("Random bytes are never accepted as a message")
    func randomBytes() throws {
        var generator = SystemRandomNumberGenerator()
        for size in [0, 1, 63, 64, 100, 1088, 5000] {
            let bytes = (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if case .success(let contents) = try decode(bytes) {
                Issue.record("random bytes of size \(size) decoded as \(contents.header)")
            }
        }
    }
}

extension Result {
    var failureValue: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
