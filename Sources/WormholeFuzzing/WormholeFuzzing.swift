import Foundation
import WormholeKit
import WormholePostgres

/// Entry points for fuzzing every decoder of bytes that another process wrote: mailbox files, queue logs, consumer
/// positions, suite documents and logs, live packets, the primary keys of a store's history rows, and what the
/// PostgreSQL engine reads of notifications and rows. Not API: the
/// `WormholeFuzz` target and the corpus test use them.
///
/// Each takes any bytes, must not crash nor hang, and checks that whatever decodes encodes back to the same thing.
package enum WormholeFuzzing {
    /// The decoders, chosen by the first byte of a fuzz input.
    package enum Target: UInt8, CaseIterable, Sendable {
        case mailboxFile = 0
        case queueLog
        case consumerPosition
        case suiteDocument
        case livePacket
        case suiteLog
        case historyKey
        /// What the PostgreSQL engine reads of notifications and rows (`PostgresWireFuzzing`).
        case carriedAppend
        case liveEnvelope
        case sealedNotification
        case rowNumber

        /// The PostgreSQL engine's entry point of this target, if it is one.
        var postgres: PostgresWireFuzzing.Entry? {
            switch self {
            case .carriedAppend: .carriedAppend
            case .liveEnvelope: .liveEnvelope
            case .sealedNotification: .sealedNotification
            case .rowNumber: .rowNumber
            default: nil
            }
        }
    }

    /// Runs the decoder the first byte selects on the rest of the bytes.
    package static func run(_ input: [UInt8]) {
        guard let first = input.first else { return }
        let bytes = Array(input.dropFirst())
        switch Target(rawValue: first % UInt8(Target.allCases.count))! {
        case .mailboxFile: mailboxFile(bytes)
        case .queueLog: queueLog(bytes)
        case .consumerPosition: consumerPosition(bytes)
        case .suiteDocument: suiteDocument(bytes)
        case .livePacket: livePacket(bytes)
        case .suiteLog: suiteLog(bytes)
        case .historyKey: historyKey(bytes)
        case let target: PostgresWireFuzzing.run(target.postgres!, bytes)
        }
    }

    static func mailboxFile(_ bytes: [UInt8]) {
        let result = try? MailboxFormat.decodeFile(size: bytes.count) { (count, offset) throws(WormholeError) in
            Array(bytes[min(offset, bytes.count)..<min(offset + count, bytes.count)])
        }
        guard case .success(let contents)? = result, let (slot, record) = contents.newest else { return }
        // What decodes is whole: encoding it again gives a record that decodes to the same.
        let encoded = MailboxFormat.encodeRecord(record)
        precondition(encoded.count <= contents.header.slotCapacity)
        guard case .valid(let again) = MailboxFormat.decodeSlot(encoded[...], capacity: contents.header.slotCapacity),
            again == record
        else { preconditionFailure("a mailbox record did not survive re-encoding (slot \(slot))") }
    }

    static func queueLog(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { buffer in
            var offset = 0
            var steps = 0
            while offset < buffer.count {
                steps += 1
                precondition(steps <= buffer.count + 1, "the queue parser stopped making progress")
                // The reader's own rule, with the bytes as the whole log.
                switch QueueFormat.step(buffer, at: offset, reachesEnd: true) {
                case .record(let record, let size):
                    precondition(size > 0)
                    let encoded = QueueFormat.encode(
                        payload: UnsafeRawBufferPointer(rebasing: buffer[record.payload]),
                        sender: Array(buffer[record.sender]),
                        timestampNanoseconds: record.timestampNanoseconds
                    )
                    precondition(encoded.count == size, "a queue record did not survive re-encoding")
                    offset += size
                case .resume(let next):
                    precondition(next > offset && next < buffer.count)
                    offset = next
                case .nothingBefore, .read:
                    preconditionFailure("bytes that run to the end of the log were read again")
                case .wait:
                    // What is left is a record being written, or no record: nothing in it is whole.
                    precondition(QueueFormat.nextRecord(in: buffer, after: offset) == nil)
                    return
                }
            }
        }
    }

    static func consumerPosition(_ bytes: [UInt8]) {
        // The whole file, three slots: whatever it decodes to is a slot that reads back the same once encoded again.
        if case .position(let slot) = QueueCursorFile.decodeFile(bytes), let generation = slot.generation {
            var encoded = [UInt8](repeating: 0, count: QueueCursorFile.slotSize)
            encoded.withUnsafeMutableBytes {
                QueueCursorFile.encodeSlot(offset: slot.offset, last: slot.last, generation: generation, into: $0)
            }
            precondition(
                QueueCursorFile.decodeSlot(encoded[...]) == slot,
                "a consumer position slot did not survive re-encoding"
            )
        }
        guard let decoded = QueueCursorFile.decode(bytes), let offset = decoded.offset else { return }
        precondition(QueueCursorFile.encode(offset) == bytes, "a consumer position did not survive re-encoding")
    }

    static func suiteDocument(_ bytes: [UInt8]) {
        guard let document = try? SuiteDocument(decoding: Data(bytes), suite: "fuzz") else { return }
        // A document JSON can hold but not write back (a number out of range) fails its next update with a clear
        // error; what does encode must read back the same.
        guard let encoded = try? document.encoded() else { return }
        guard let again = try? SuiteDocument(decoding: encoded, suite: "fuzz") else {
            preconditionFailure("a suite document that encoded did not decode again")
        }
        precondition(again.version == document.version && again.values == document.values && again.log == document.log)
    }

    static func suiteLog(_ bytes: [UInt8]) {
        var offset = 0
        if case .success(.log) = SuiteLogFormat.decodeHeader(bytes[...]) { offset = SuiteLogFormat.headerSize }
        while offset < bytes.count {
            switch SuiteLogFormat.parse(bytes[...], at: offset) {
            case .record(let record, let size):
                // What decodes is whole: encoding it again gives the same bytes' record.
                var encoded: [UInt8] = []
                SuiteLogFormat.encode(record, appendingTo: &encoded)
                guard case .record(let again, let againSize) = SuiteLogFormat.parse(encoded[...], at: 0),
                    again == record, againSize == encoded.count
                else { preconditionFailure("a suite log record did not survive re-encoding") }
                offset += size
            case .incomplete, .invalid:
                _ = SuiteLogFormat.validRecordFollows(bytes[...], after: offset)
                return
            }
        }
    }

    static func livePacket(_ bytes: [UInt8]) {
        guard let packet = LivePacket(bytes) else { return }
        precondition(LivePacket(packet.encoded()) == packet, "a live packet did not survive re-encoding")
        let reusing = bytes.withUnsafeBytes { LivePacket($0, knownSender: packet.sender) }
        precondition(reusing == packet, "a live packet decoded differently with its sender known")
    }

    /// A history row's primary key (`PrimaryKey(historyJSON:)`): the hand-written reading of plain keys must give
    /// what `JSONDecoder` gives whenever it reads one, and the whole reading must not crash on anything.
    static func historyKey(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        _ = PrimaryKey(historyJSON: text)
        guard let plain = PrimaryKey.plainColumns(text) else { return }
        let decoded = try? JSONDecoder().decode([String: PrimaryKeyValue].self, from: Data(text.utf8))
        precondition(decoded == plain, "a plain history key read otherwise than JSONDecoder reads it: \(text)")
    }

    /// Valid inputs for each decoder, to seed a corpus.
    package static func seeds() -> [(name: String, bytes: [UInt8])] {
        let record = MailboxFormat.Record(
            sequence: 3,
            timestampNanoseconds: 1_700_000_000_000_000_000,
            isCleared: false,
            sender: Array("app[1]".utf8),
            payload: Array(#"{"number":1}"#.utf8)
        )
        let mailbox = MailboxFormat.encodeFile(header: .init(slotCapacity: 512, generation: 7), record: record)
        var queue: [UInt8] = []
        for text in [#"{"a":1}"#, #"{"b":2}"#, "x"] {
            queue += Array(text.utf8).withUnsafeBytes {
                QueueFormat.encode(payload: $0, sender: Array("p".utf8), timestampNanoseconds: 1)
            }
        }
        let torn = Array(queue.prefix(queue.count - 3))
        var document = SuiteDocument()
        document.version = 2
        document.values = SuiteValues(storage: ["theme": Data(#""dark""#.utf8), "size": Data("12".utf8)])
        document.log = [
            .init(
                version: 2,
                keys: ["theme"],
                sender: "app",
                direction: "app→widget",
                time: 1,
                values: ["theme": Data(#""dark""#.utf8)]
            )
        ]
        let suite = (try? document.encoded()).map(Array.init) ?? []
        var suiteLog = SuiteLogFormat.encodeHeader(generation: 9)
        SuiteLogFormat.encode(
            .init(
                kind: .snapshot,
                version: 1,
                timestampNanoseconds: 1,
                sender: "",
                direction: nil,
                entries: [("size", Data("12".utf8))]
            ),
            appendingTo: &suiteLog
        )
        SuiteLogFormat.encode(
            .init(
                kind: .change,
                version: 2,
                timestampNanoseconds: 2,
                sender: "app",
                direction: "app→widget",
                entries: [("size", nil), ("theme", Data(#""dark""#.utf8))]
            ),
            appendingTo: &suiteLog
        )
        let packet = LivePacket(kind: .request, sender: "app[1]", payload: Data(#"{"term":"swift"}"#.utf8)).encoded()
        // A position file of three slots: written once, then stored into the third, whose newer position names the
        // record it ends.
        var positions = [UInt8](repeating: 0, count: QueueCursorFile.fileSize)
        positions.withUnsafeMutableBytes { file in
            for start in [0, QueueCursorFile.slotStride] {
                QueueCursorFile.encodeSlot(
                    offset: 4096,
                    last: nil,
                    generation: 7,
                    into: UnsafeMutableRawBufferPointer(rebasing: file[start...])
                )
            }
            QueueCursorFile.encodeSlot(
                offset: 4160,
                last: .init(start: 4096, timestampNanoseconds: 1),
                generation: 8,
                into: UnsafeMutableRawBufferPointer(rebasing: file[(2 * QueueCursorFile.slotStride)...])
            )
        }
        return [
            ("mailbox-file", [Target.mailboxFile.rawValue] + mailbox),
            ("queue-log", [Target.queueLog.rawValue] + queue),
            ("queue-log-torn", [Target.queueLog.rawValue] + torn),
            ("consumer-position", [Target.consumerPosition.rawValue] + QueueCursorFile.encode(4096)),
            ("consumer-position-slots", [Target.consumerPosition.rawValue] + positions),
            ("suite-document", [Target.suiteDocument.rawValue] + suite),
            ("live-packet", [Target.livePacket.rawValue] + packet),
            ("history-key", [Target.historyKey.rawValue] + Array(#"{"id":42,"name":"a b","gone":null}"#.utf8)),
            ("history-key-jsonb", [Target.historyKey.rawValue] + Array(#"{"a": -7, "b": "x"}"#.utf8)),
            ("suite-log", [Target.suiteLog.rawValue] + suiteLog),
            ("suite-log-torn", [Target.suiteLog.rawValue] + suiteLog.dropLast(5)),
        ]
            + PostgresWireFuzzing.seeds().map { seed in
                let target = Target.allCases.first { $0.postgres == seed.entry }!
                return ("postgres-\(target)", [target.rawValue] + seed.bytes)
            }
    }
}
