import Foundation
import Synchronization
import Testing

@testable import WormholeKit

/// The suite file's log (format version 2): what an update appends, compaction, a torn tail, damage, and the
/// version 1 files it replaces.
@Suite("Suite files: the log", .limit(minutes: 2))
struct SuiteLogTests {
    let directory = TemporaryDirectory()
    var path: String { directory("wormhole") }
    var file: String { path + "/settings.suite" }

    func makeSuite(sender: String = "tests") throws -> WormholeSuite {
        try Wormhole(directory: path, configuration: .init(sender: sender)).suite("settings")
    }

    func fileSize() throws -> Int { try FileManager.default.attributesOfItem(atPath: file)[.size] as! Int }

    /// The records of the suite file, in order.
    func records() throws -> [SuiteLogFormat.Record] {
        let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: file)))
        guard case .success(.log) = SuiteLogFormat.decodeHeader(bytes[...]) else { return [] }
        var result: [SuiteLogFormat.Record] = []
        var offset = SuiteLogFormat.headerSize
        while case .record(let record, let size) = SuiteLogFormat.parse(bytes[...], at: offset) {
            result.append(record)
            offset += size
        }
        #expect(offset == bytes.count, "bytes after the last whole record")
        return result
    }

    @Test("An update appends one record with only the keys it changed, whatever the size of the suite")
    func updateAppendsItsKeys() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.update { values in
                for index in 0..<1000 { try values.set("value \(index)", forKey: "key\(index)") }
            }
            let before = try fileSize()
            try suite.set("changed", forKey: "key500", direction: "app→widget")
            let appended = try fileSize() - before
            #expect(appended < 120, "one set among 1,000 keys appended \(appended) bytes")
            let last = try #require(try records().last)
            #expect(last.kind == .change && last.version == 2 && last.sender == "tests")
            #expect(last.direction == "app→widget")
            #expect(last.entries.map(\.key) == ["key500"] && last.entries[0].value == Data(#""changed""#.utf8))
            // Setting a key to the value it has changes nothing and appends nothing.
            try suite.set("changed", forKey: "key500")
            try suite.update { values in
                try values.set("other", forKey: "key1")
                try values.set("value 1", forKey: "key1")  // back to what it was
            }
            #expect(try fileSize() - before == appended)
            // A removal is recorded as such.
            try suite.removeValue(forKey: "key2")
            let removal = try #require(try records().last)
            #expect(removal.entries.count == 1 && removal.entries[0].key == "key2" && removal.entries[0].value == nil)
            #expect(try makeSuite().snapshot().keys.count == 999)
        }
    }

    @Test("An update that throws, or is too large, changes nothing, in memory or in the file")
    func failedUpdatesChangeNothing() async throws {
        try await offThePool {
            struct Refused: Error {}
            var configuration = Wormhole.Configuration(sender: "tests")
            configuration.fileOptions.maximumMessageSize = 4096
            let suite = try Wormhole(directory: path, configuration: configuration).suite("settings")
            try suite.set(1, forKey: "a")
            let size = try fileSize()
            let thrown = #expect(throws: WormholeError.self) {
                try suite.update { values in
                    try values.set(2, forKey: "a")
                    values.removeValue(forKey: "a")
                    try values.set(3, forKey: "b")
                    throw Refused()
                }
            }
            #expect(thrown?.code == .handlerFailed)
            let tooLarge = #expect(throws: WormholeError.self) {
                try suite.set(String(repeating: "x", count: 8192), forKey: "b")
            }
            #expect(tooLarge?.code == .messageTooLarge)
            #expect(try fileSize() == size)
            let snapshot = try suite.snapshot()
            #expect(snapshot.keys == ["a"] && snapshot["a", as: Int.self] == 1)
            try suite.set(4, forKey: "b")
            #expect(try makeSuite().snapshot().keys == ["a", "b"])
        }
    }

    @Test("A body that replaces the whole value: every key it dropped is recorded as removed")
    func bodyReplacesTheValue() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.update { values in
                try values.set(1, forKey: "a")
                try values.set(2, forKey: "b")
            }
            try suite.update { values in
                var fresh = SuiteValues()
                try fresh.set(2, forKey: "b")
                try fresh.set(3, forKey: "c")
                values = fresh
            }
            let last = try #require(try records().last)
            #expect(last.entries.map(\.key) == ["a", "c"] && last.entries[0].value == nil)
            #expect(try makeSuite().snapshot() == suite.snapshot())
            #expect(try suite.snapshot().keys == ["b", "c"])
        }
    }

    @Test("A key too long for a record is refused with a typed error, and changes nothing")
    func longKey() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.set(1, forKey: "a")
            let size = try fileSize()
            let refused = #expect(throws: WormholeError.self) {
                try suite.set(1, forKey: String(repeating: "k", count: 70_000))
            }
            #expect(refused?.code == .encodingFailed)
            #expect(try fileSize() == size && suite.snapshot().keys == ["a"])
        }
    }

    @Test("An observer of a suite whose file was removed is told what changed when it starts over")
    func suiteStartsOver() async throws {
        try await offThePool {
            let writer = try makeSuite(sender: "writer")
            try writer.update { values in
                try values.set("dark", forKey: "theme")
                try values.set(12, forKey: "size")
            }
            let reader = try makeSuite(sender: "reader")
            let changes = Locked<[SuiteChange]>([])
            let observer = try reader.observe(on: .notifierThread) { change in changes.withLock { $0.append(change) } }
            defer { observer.cancel() }
            try FileManager.default.removeItem(atPath: file)
            // The new suite's first update has the version the observer saw last: only the lineage tells.
            try makeSuite(sender: "other").set("light", forKey: "theme")
            #expect(eventually { changes.withLock { $0.last?.keys } == ["theme", "size"] })
            #expect(changes.withLock { $0.last?.values["theme", as: String.self] } == "light")
        }
    }

    @Test("Compaction keeps every value and the last changes, and observers in another wormhole miss none")
    func compaction() async throws {
        try await offThePool {
            let writer = try makeSuite(sender: "writer")
            let reader = try makeSuite(sender: "reader")
            try writer.update { values in
                for index in 0..<100 { try values.set(index, forKey: "key\(index)") }
            }
            let seen = Locked<[Int]>([])
            let observer = try reader.observe(keys: ["counter"], on: .notifierThread) { change in
                if let value = change.values["counter", as: Int.self] { seen.withLock { $0.append(value) } }
            }
            defer { observer.cancel() }
            let padding = String(repeating: "p", count: 1000)
            // About 1 KiB a record: several compactions past the 64 KiB threshold. An observer that falls more than
            // the log's 64 changes behind is told their difference instead (a stall of the monitor thread of a few
            // milliseconds, which other tests' callbacks can cause, is enough): the writer waits for it every 16.
            for counter in 1...300 {
                try writer.update { values in
                    try values.set(counter, forKey: "counter")
                    try values.set("\(padding) \(counter)", forKey: "padding")
                }
                if counter % 16 == 0 { #expect(eventually { seen.withLock { $0.last ?? 0 } >= counter - 16 }) }
            }
            #expect(try fileSize() < 200 * 1024, "the log was not compacted")
            let records = try records()
            let history = records.filter { $0.kind == .history }
            #expect(history.count <= DirectorySuiteStore.logLimit)
            #expect(records.filter { $0.kind == .snapshot }.count == 1)
            #expect(eventually { seen.withLock { $0 } == Array(1...300) })
            // A wormhole opened now reads the compacted file: every value, at the version of the last update.
            let fresh = try makeSuite().store.read()
            #expect(fresh.version == 301)
            #expect(fresh.values["counter", as: Int.self] == 300 && fresh.values["key99", as: Int.self] == 99)
            // The history serves an observer that was away for fewer changes than the file keeps.
            let (_, changes) = try makeSuite().store.changes(after: 290)
            #expect(changes?.map(\.version) == Array(291...301))
            #expect(changes?.first?.sender == "writer")
        }
    }

    @Test("A tail torn by a writer that died is skipped by readers and cut off by the next writer")
    func tornTail() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.set(1, forKey: "a")
            try suite.set(2, forKey: "b")
            let whole = try Data(contentsOf: URL(fileURLWithPath: file))
            // The first 30 bytes of another record, as a writer killed mid-write (or a power cut) leaves them.
            var record: [UInt8] = []
            SuiteLogFormat.encode(
                .init(kind: .change, version: 4, timestampNanoseconds: 0, sender: "x", direction: nil, entries: []),
                appendingTo: &record
            )
            try (whole + Data(record.prefix(30))).write(to: URL(fileURLWithPath: file))
            #expect(try makeSuite().snapshot()["b", as: Int.self] == 2)
            try makeSuite().set(3, forKey: "c")
            let records = try records()  // checks that no byte follows the last whole record
            #expect(records.last?.version == 3 && records.last?.entries.first?.key == "c")
            #expect(try suite.snapshot().keys == ["a", "b", "c"])
        }
    }

    @Test("Values that look like record heads do not make a torn tail look like damage")
    func valuesThatLookLikeRecords() async throws {
        try await offThePool {
            let suite = try makeSuite()
            try suite.set(String(repeating: "WHSR", count: 200), forKey: "a")
            let whole = try Data(contentsOf: URL(fileURLWithPath: file))
            var record: [UInt8] = []
            SuiteLogFormat.encode(
                .init(
                    kind: .change,
                    version: 2,
                    timestampNanoseconds: 0,
                    sender: "x",
                    direction: nil,
                    entries: [("b", Data(#""\#(String(repeating: "WHSR", count: 200))""#.utf8))]
                ),
                appendingTo: &record
            )
            try (whole + Data(record.prefix(record.count - 1))).write(to: URL(fileURLWithPath: file))
            #expect(try makeSuite().snapshot().keys == ["a"])
            try makeSuite().set(2, forKey: "c")
            #expect(try suite.snapshot().keys == ["a", "c"])
        }
    }

    @Test("A torn record whose bytes hold a whole record is a torn tail, not damage")
    func recordInsideATornRecord() {
        var inner: [UInt8] = []
        SuiteLogFormat.encode(
            .init(kind: .change, version: 9, timestampNanoseconds: 1, sender: "x", direction: nil, entries: []),
            appendingTo: &inner
        )
        var outer: [UInt8] = []
        SuiteLogFormat.encode(
            .init(
                kind: .change,
                version: 8,
                timestampNanoseconds: 1,
                sender: "x",
                direction: nil,
                entries: [("a", Data(inner)), ("b", Data("1".utf8))]
            ),
            appendingTo: &outer
        )
        // Cut short, as a writer killed mid-append leaves it: the record inside is its own bytes.
        #expect(!SuiteLogFormat.validRecordFollows(outer.dropLast(3)[...], after: 0))
        // Whole but torn inside (a power cut): the same.
        var torn = outer
        torn[torn.count - 1] ^= 0xFF
        #expect(!SuiteLogFormat.validRecordFollows(torn[...], after: 0))
        // A whole record after a damaged one is damage.
        #expect(SuiteLogFormat.validRecordFollows((torn + inner)[...], after: 0))
    }

    @Test("Damage before the last record, an unknown version and a planted link are refused with typed errors")
    func damageIsRefused() async throws {
        try await offThePool {
            let suite = try makeSuite()
            for index in 0..<5 { try suite.set(index, forKey: "key\(index)") }
            var bytes = Array(try Data(contentsOf: URL(fileURLWithPath: file)))
            bytes[bytes.count - 60] ^= 0xFF  // inside the fourth change: the fifth still follows
            try Data(bytes).write(to: URL(fileURLWithPath: file))
            let read = #expect(throws: WormholeError.self) { try makeSuite().snapshot() }
            #expect(read?.code == .corruptMessage && read?.path == file)
            #expect(read?.message.contains("Remove \(file)") == true)
            let update = #expect(throws: WormholeError.self) { try makeSuite().set(9, forKey: "z") }
            #expect(update?.code == .corruptMessage)

            var header = SuiteLogFormat.encodeHeader(generation: 1)
            header.store(UInt16(3), at: 4)
            try Data(header).write(to: URL(fileURLWithPath: file))
            let newer = #expect(throws: WormholeError.self) { try makeSuite().snapshot() }
            #expect(newer?.code == .unsupportedFormatVersion)

            try FileManager.default.removeItem(atPath: file)
            try FileManager.default.createSymbolicLink(atPath: file, withDestinationPath: directory("elsewhere"))
            let link = #expect(throws: WormholeError.self) { try makeSuite().set(1, forKey: "a") }
            #expect(link?.code == .untrustedFile)
            #expect(!FileManager.default.fileExists(atPath: directory("elsewhere")))
        }
    }

    @Test("A version 1 file is read as it is, and the first update rewrites it as a log, keeping values and history")
    func versionOneFile() async throws {
        try await offThePool {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            var document = SuiteDocument()
            document.version = 7
            document.values = SuiteValues(storage: ["theme": Data(#""dark""#.utf8), "size": Data("12".utf8)])
            document.log = [
                .init(
                    version: 6,
                    keys: ["size"],
                    sender: "old",
                    direction: nil,
                    time: 1,
                    values: ["size": Data("12".utf8)]
                ),
                .init(
                    version: 7,
                    keys: ["theme"],
                    sender: "old",
                    direction: "a→b",
                    time: 2,
                    values: ["theme": Data(#""dark""#.utf8)]
                ),
            ]
            let record = MailboxFormat.Record(
                sequence: 1,
                timestampNanoseconds: 0,
                isCleared: false,
                sender: Array("old".utf8),
                payload: Array(try document.encoded())
            )
            let header = MailboxFormat.Header(
                slotCapacity: MailboxFormat.slotCapacity(forRecordSize: record.encodedSize),
                generation: 5
            )
            try Data(MailboxFormat.encodeFile(header: header, record: record)).write(to: URL(fileURLWithPath: file))
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file)

            let suite = try makeSuite()
            #expect(try suite.value(forKey: "theme", as: String.self) == "dark")
            let (_, logged) = try suite.store.changes(after: 5)
            #expect(logged?.map(\.version) == [6, 7] && logged?.last?.direction == "a→b")

            try suite.set(13, forKey: "size")
            let records = try records()
            #expect(records.map(\.kind) == [.history, .history, .snapshot, .change])
            #expect(records.last?.version == 8)
            let reopened = try makeSuite().store
            #expect(
                try reopened.read().values
                    == SuiteValues(storage: ["theme": Data(#""dark""#.utf8), "size": Data("13".utf8)])
            )
            #expect(try reopened.changes(after: 5).changes?.map(\.version) == [6, 7, 8])
        }
    }
}
