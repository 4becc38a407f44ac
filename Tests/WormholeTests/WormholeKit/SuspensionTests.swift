import Foundation
import Testing
import WormholeCLI
import WormholeKit
import WormholeStore

/// iOS's rule for shared containers (`0xdead10cc`), tried on Linux: a process whose wormholes are suspended refuses new
/// work that would lock with a typed error, writes nothing of it, lets the locks of calls under way go, and then holds
/// no lock at all while it stays suspended; readers and consumers go on; resumed, it catches up.
///
/// Suspension is process-wide, so the suspended process is a child (`suspension-check` of the harness), watched from
/// here through the kernel's lock table, its files and what it prints.
@Suite(
    "Suspension: a suspended process takes no lock",
    .serialized,
    .limit(minutes: 2),
    .linuxOnly("the child's locks are read from the lock table of Linux's proc file system")
)
struct SuspensionTests {
    @Test("New work is refused with `suspended`, nothing of it is written, no lock is held, and all resumes after")
    func suspendedProcess() throws {
        let temporary = TemporaryDirectory()
        let directory = temporary("wormhole")
        let control = temporary("control")
        try FileManager.default.createDirectory(atPath: control, withIntermediateDirectories: true)
        func signal(_ name: String) { _ = FileManager.default.createFile(atPath: control + "/" + name, contents: nil) }

        let child = try RunningTool(["suspension-check", "--directory", directory, "--control", control])
        defer {
            signal("release")
            signal("resume")
            signal("finish")
            _ = child.finish(timeout: 20)
        }
        func printed(_ line: String) -> Bool { child.outputLines.contains(line) }
        func calls() -> [String: String] {
            var calls: [String: String] = [:]
            for line in child.outputLines where line.hasPrefix("{") {
                guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String],
                    let call = object["call"]
                else { continue }
                calls[call] = object["code"]
            }
            return calls
        }
        let process = child.processIdentifier

        // Holding: the suite update under way holds its file's lock, which the lock table shows.
        try #require(eventually(timeout: 30) { printed("step holding") }, "\(child.errorSoFar)")
        #expect(eventually { Self.locks(heldBy: process).contains { $0.isPackageLock } })
        signal("holding-seen")

        // Suspended: every call that would lock is refused, and the update under way still holds its lock.
        try #require(eventually(timeout: 20) { printed("step suspended") }, "\(child.errorSoFar)")
        let refused = calls()
        for call in ["pass", "suite", "coordinated", "consumer", "store"] {
            #expect(refused[call] == "suspended", "\(call): \(refused[call] ?? "not tried")")
        }
        #expect(refused["released-while-held"] == "false", "the held update's lock went unnoticed")

        // Other processes go on meanwhile: this one enqueues and commits; the child's consumer reads (no lock).
        let wormhole = try Wormhole(directory: directory)
        try wormhole.queue("jobs", retention: .seconds(4)).enqueue("during")
        let store = try SharedStore(
            path: directory + "/store.sqlite",
            migrator: StoreFixtures.itemsMigrator,
            configuration: .init(author: "test", observesRemoteChanges: false)
        )
        try store.write { db in
            try db.execute(sql: "INSERT INTO item(writer, value) VALUES (?, ?)", arguments: ["test", "during"])
        }
        #expect(eventually { printed(#"{"consumed":"during"}"#) }, "a suspended consumer still reads")

        // Released: the update ends, and from then on the child holds no lock of the package's and no write lock of
        // SQLite's, through two of its consumer's intervals of marking itself alive (1 s), which it skips.
        signal("release")
        try #require(eventually(timeout: 20) { printed("step released") }, "\(child.errorSoFar)")
        #expect(calls()["released"] == "true")
        Thread.sleep(forTimeInterval: 0.1)
        let position = directory + "/jobs.consumers/worker"
        let markedBefore = try Self.modificationTime(position)
        let sampleEnd = Date().addingTimeInterval(2.5)
        var held: [LockEntry] = []
        while Date() < sampleEnd {
            held += Self.locks(heldBy: process).filter { $0.isPackageLock || $0.isSQLiteWriteLock }
            Thread.sleep(forTimeInterval: 0.005)
        }
        #expect(held.isEmpty, "locks held while suspended: \(held)")
        #expect(try Self.modificationTime(position) == markedBefore, "a suspended consumer marked itself")
        #expect(!printed(#"{"remote":"test"}"#), "a suspended observer was handed a commit it could not acknowledge")

        // Resumed: writes go through again, the observer catches up, and the consumer marks itself again.
        signal("resume")
        try #require(eventually(timeout: 20) { printed("step resumed") }, "\(child.errorSoFar)")
        #expect(eventually { printed(#"{"remote":"test"}"#) }, "the commit made while suspended never came")
        #expect(eventually { (try? Self.modificationTime(position)).map { $0 > markedBefore } == true })
        #expect(try wormhole.message(withIdentifier: "box", as: String.self) == "after")
        #expect(try wormhole.suite("settings").value(forKey: "state", as: String.self) == "after")
        #expect(try wormhole.suite("held").value(forKey: "state", as: String.self) == "held")
        #expect(try wormhole.message(withIdentifier: "coordinated", as: String.self) == nil)
        let values = try store.read { db in try String.fetchAll(db, sql: "SELECT value FROM item ORDER BY id") }
        #expect(values == ["before", "during", "after"])

        signal("finish")
        let result = child.finish(timeout: 20)
        #expect(result.status == 0, "\(result.error)")
    }

    /// A line of `/proc/locks`: `1: FLOCK  ADVISORY  WRITE 2893 fd:01:1316 0 EOF`.
    struct LockEntry: CustomStringConvertible {
        var kind: String
        var access: String
        var line: String

        /// A `flock` lock: every lock the package takes itself is one.
        var isPackageLock: Bool { kind == "FLOCK" }
        /// A POSIX write lock: SQLite's, held by a writer (a reader's shared locks of WAL mode are allowed, as GRDB's
        /// suspension allows reads).
        var isSQLiteWriteLock: Bool { kind.hasPrefix("POSIX") || kind.hasPrefix("OFDLCK") ? access == "WRITE" : false }
        var description: String { line }
    }

    /// The locks that `process` holds now (waiters, marked `->`, are left out).
    static func locks(heldBy process: Int32) -> [LockEntry] {
        #if os(Linux) || os(Android)
        guard let text = try? String(contentsOfFile: "/proc/locks", encoding: .utf8) else { return [] }
        #else
        let text = ""  // the suite runs on Linux only
        #endif
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, !fields.contains("->"), Int32(fields[4]) == process else { return nil }
            return LockEntry(kind: String(fields[1]), access: String(fields[3]), line: String(line))
        }
    }

    static func modificationTime(_ path: String) throws -> Date {
        try #require(try FileManager.default.attributesOfItem(atPath: path)[.modificationDate] as? Date)
    }
}
