import Foundation
import Testing
import WormholeCrashStates
import WormholeKit

/// What a power cut leaves, explored: `WormholeHarness power-loss` records a workload of each mode with strace,
/// builds the states a power cut may leave at each point (ext4's `data=ordered`, torn at 512-byte boundaries) and
/// checks each with the library. `scripts/power-loss` runs larger workloads; RELIABILITY.md has the figures. The
/// regression tests below keep the states that once broke a promise.
@Suite("Power loss", .slow("the power-loss explorer replays thousands of traces"), .limit(minutes: 5))
struct PowerLossTests {
    let directory = TemporaryDirectory()

    // One case at a time, each on a thread of its own: an explorer keeps a CPU busy for seconds, and waiting for it on
    // the cooperative pool would starve the other suites' tests.
    @Test(
        "The crash states of a small workload keep the mode's promise, with and without synchronizesWrites",
        .serialized,
        arguments: ["mailbox", "queue", "suite", "transfer"],
        [false, true]
    )
    func explore(mode: String, synchronizes: Bool) async throws {
        try await offThePool { try exploreBody(mode: mode, synchronizes: synchronizes) }
    }

    func exploreBody(mode: String, synchronizes: Bool) throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/strace") else {
            try Test.cancel("strace is not installed (apt-get install strace)")
        }
        let result = try WormholeTool.run(
            ["power-loss", mode, "--count", "10", "--states-per-point", "40", "--directory", directory(mode)]
                + (synchronizes ? ["--synchronizes"] : []),
            timeout: 240
        )
        #expect(result.status == 0, "\(result.lines) \(result.error)")
        let summary = try #require(result.lines.last)
        #expect(summary.contains(" 0 failures"), "\(summary)")
        let checked = summary.split(separator: ",").first { $0.hasSuffix("states checked") }
        #expect((checked?.split(separator: " ").first).flatMap { Int($0) } ?? 0 >= 20, "\(summary)")
    }

    // MARK: Regressions: orders of system calls the explorer found wrong

    /// The operations a workload of `mode` makes, read from its trace (strace, as the explorer records it).
    func tracedOperations(_ mode: String, synchronizes: Bool) throws -> [FileOperations.Operation] {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/strace") else {
            try Test.cancel("strace is not installed (apt-get install strace)")
        }
        let root = directory("trace-\(mode)-\(synchronizes)")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let trace = root + ".trace"
        let strace = Process()
        strace.executableURL = URL(fileURLWithPath: "/usr/bin/strace")
        strace.arguments =
            [
                "-f", "-qq", "-y", "-xx", "-s", "67108864", "-o", trace,
                "-e", "trace=" + SystemCallTrace.tracedCalls.joined(separator: ","),
                WormholeTool.harnessPath, "power-workload", mode, "--directory", root + "/wormhole", "--count", "12",
            ] + (synchronizes ? ["--synchronizes"] : [])
        strace.standardOutput = FileHandle.nullDevice
        try strace.run()
        strace.waitUntilExit()
        #expect(strace.terminationStatus == 0, "the traced workload failed")
        let text = String(decoding: try Data(contentsOf: URL(fileURLWithPath: trace)), as: UTF8.self)
        return try FileOperations(calls: try SystemCallTrace.parse(text), root: root).operations
    }

    @Test(
        "A file renamed into place (a mailbox or suite outgrowing its slots) is flushed before the rename, in either setting",
        arguments: ["mailbox", "suite"],
        [false, true]
    )
    func flushedBeforeRename(mode: String, synchronizes: Bool) async throws {
        try await offThePool {
            let operations = try tracedOperations(mode, synchronizes: synchronizes)
            var names: [String: Int] = [:]  // "parent/name" to inode
            var unflushed: Set<Int> = []  // inodes written since their last flush
            var renames = 0
            for operation in operations {
                switch operation {
                case .create(let parent, let name, let inode), .link(let parent, let name, let inode):
                    names["\(parent)/\(name)"] = inode
                case .write(let inode, _, _, _), .truncate(let inode, _), .zero(let inode, _, _):
                    unflushed.insert(inode)
                case .synchronize(let inode):
                    unflushed.remove(inode)
                case .synchronizeAll:
                    unflushed.removeAll()
                case .rename(let fromParent, let fromName, let toParent, let toName):
                    let inode = names.removeValue(forKey: "\(fromParent)/\(fromName)")
                    if let inode {
                        renames += 1
                        #expect(
                            !unflushed.contains(inode),
                            "\(fromName) was renamed to \(toName) before its bytes were flushed"
                        )
                        names["\(toParent)/\(toName)"] = inode
                    }
                case .remove(let parent, let name):
                    names.removeValue(forKey: "\(parent)/\(name)")
                default:
                    break
                }
            }
            #expect(renames > 0, "the workload renamed no file into place: nothing was checked")
        }
    }

    @Test(
        "With synchronizesWrites, every write, and the name of every file holding data, is flushed before its call returns",
        arguments: ["mailbox", "queue", "suite", "transfer"]
    )
    func synchronizedBeforeReturning(mode: String) async throws {
        try await offThePool {
            let operations = try tracedOperations(mode, synchronizes: true)
            var notificationDirectories: Set<Int> = []  // `.notifications`: wake-up tokens, which hold no data
            var tokens: Set<Int> = []  // the wake-up tokens' files
            var createdIn: [Int: Int] = [:]  // a new file's directory, until its name is flushed
            var pendingData: Set<Int> = []  // inodes written since their last flush
            var pendingDirectories: Set<Int> = []  // directories whose changes name data, since their last flush
            var markers = 0
            for operation in operations {
                switch operation {
                case .makeDirectory(let parent, let name, let inode):
                    if name == ".notifications" { notificationDirectories.insert(inode) }
                    pendingDirectories.insert(parent)
                case .create(let parent, _, let inode):
                    // An empty file whose creation a power cut loses is made again; it matters once it holds data.
                    if notificationDirectories.contains(parent) {
                        tokens.insert(inode)
                    } else {
                        createdIn[inode] = parent
                    }
                case .rename(let fromParent, _, let toParent, _):
                    pendingDirectories.formUnion([fromParent, toParent])
                case .write(let inode, _, _, _), .truncate(let inode, _), .zero(let inode, _, _):
                    guard !tokens.contains(inode) else { break }
                    pendingData.insert(inode)
                    if let parent = createdIn[inode] { pendingDirectories.insert(parent) }
                case .synchronize(let inode):
                    pendingData.remove(inode)
                    pendingDirectories.remove(inode)
                    createdIn = createdIn.filter { $0.value != inode }
                case .synchronizeAll:
                    pendingData.removeAll()
                    pendingDirectories.removeAll()
                    createdIn.removeAll()
                case .marker(let call):
                    markers += 1
                    #expect(pendingData.isEmpty, "\(call) returned with writes not flushed: inodes \(pendingData)")
                    #expect(
                        pendingDirectories.isEmpty,
                        "\(call) returned with names of data not flushed: directories \(pendingDirectories)"
                    )
                    pendingData.removeAll()
                    pendingDirectories.removeAll()
                default:
                    break
                }
            }
            #expect(markers > 0, "the workload marked no call: nothing was checked")
        }
    }

    // MARK: Regressions: states the explorer found

    @Test("A position left past the end of a shortened log: a message enqueued since is not skipped")
    func positionPastTheEnd() async throws {
        try await offThePool {
            let path = directory("past")
            let queue = try Wormhole(directory: path).queue("jobs")
            for index in 0..<5 { try queue.enqueue(index) }
            let cursor = try queue.log.openCursor(consumer: "c")
            let records = try cursor.read(maximumCount: 5)
            try cursor.acknowledge(through: records.last!.end)
            // The power cut kept the position and lost the log; a producer enqueues before the consumer comes back.
            try FileManager.default.removeItem(atPath: path + "/jobs.queue")
            let reopened = try Wormhole(directory: path).queue("jobs")
            try reopened.enqueue(100)
            let after = try reopened.log.openCursor(consumer: "c").read(maximumCount: 10)
            #expect(try after.map { try JSONDecoder().decode(Int.self, from: $0.payload) } == [100])
        }
    }

    @Test("A position inside a record appended since: the consumer starts over, repeating, never skipping")
    func positionInsideARecord() async throws {
        try await offThePool {
            let path = directory("inside")
            let queue = try Wormhole(directory: path).queue("jobs")
            for index in 0..<3 { try queue.enqueue(String(repeating: "a", count: 100 + index)) }
            let cursor = try queue.log.openCursor(consumer: "c")
            let records = try cursor.read(maximumCount: 3)
            try cursor.acknowledge(through: records[1].end)
            // The power cut kept the position and only the first record; a longer record was appended since, over the
            // stored position.
            let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path + "/jobs.queue"))
            try handle.truncate(atOffset: records[0].end)
            try handle.close()
            let reopened = try Wormhole(directory: path).queue("jobs")
            try reopened.enqueue(String(repeating: "b", count: 500))
            let after = try reopened.log.openCursor(consumer: "c").read(maximumCount: 10)
            #expect(try after.map { try JSONDecoder().decode(String.self, from: $0.payload).prefix(1) } == ["a", "b"])
        }
    }

    @Test("A position at the end of a record torn by the power cut, whose header survived: new records are not skipped")
    func positionAfterATornRecord() async throws {
        try await offThePool {
            let path = directory("torn")
            let queue = try Wormhole(directory: path).queue("jobs")
            try queue.enqueue(contentsOf: ["old-0", "old-1", "old-2"])
            let cursor = try queue.log.openCursor(consumer: "c")
            let records = try cursor.read(maximumCount: 3)
            try cursor.acknowledge(through: records[1].end)
            // The power cut kept the position and the first 40 bytes of the record it ends (header and timestamp);
            // records of the same size were appended since, so that one of them ends exactly at the stored position.
            let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path + "/jobs.queue"))
            try handle.truncate(atOffset: records[1].offset + 40)
            try handle.close()
            let reopened = try Wormhole(directory: path).queue("jobs")
            try reopened.enqueue(contentsOf: ["new-0", "new-1", "new-2"])
            let after = try reopened.log.openCursor(consumer: "c").read(maximumCount: 10)
            let messages = try after.map { try JSONDecoder().decode(String.self, from: $0.payload) }
            #expect(messages == ["old-0", "new-0", "new-1", "new-2"])
        }
    }

    @Test("A damaged suite is refused by reads and updates alike (never silently emptied); removing it starts over")
    func damagedSuite() async throws {
        try await offThePool {
            let path = directory("suite")
            let suite = try Wormhole(directory: path).suite("settings")
            try suite.set(1, forKey: "a")
            // Every byte lost: the state a power cut can leave of a file whose blocks never reached the disk.
            let file = path + "/settings.suite"
            let size = try FileManager.default.attributesOfItem(atPath: file)[.size] as! Int
            try Data(repeating: 0, count: size).write(to: URL(fileURLWithPath: file))
            // Opened anew, as after the power cut: a process that read the file before keeps what it read.
            let reopened = try Wormhole(directory: path).suite("settings")
            let read = #expect(throws: WormholeError.self) { try reopened.snapshot() }
            #expect(read?.code == .corruptMessage)
            let update = #expect(throws: WormholeError.self) { try reopened.set(2, forKey: "b") }
            #expect(update?.code == .corruptMessage && update?.path == file)
            #expect(update?.message.contains("Remove \(file)") == true)
            try FileManager.default.removeItem(atPath: file)
            try reopened.set(2, forKey: "b")
            #expect(try reopened.snapshot()["b", as: Int.self] == 2)
        }
    }

    @Test(
        "A delivery marker written but the file never moved: the file is delivered, not reported at the marker's path"
    )
    func markerWithoutTheMove() async throws {
        try await offThePool {
            let path = directory("transfer")
            let source = directory("source") + "/report.txt"
            try FileManager.default.createDirectory(atPath: directory("source"), withIntermediateDirectories: true)
            try Data("hello".utf8).write(to: URL(fileURLWithPath: source))
            let transfers = try Wormhole(directory: path).transfers("files")
            let sent = try transfers.send(file: source, metadata: [:])
            // A receiver stopped after writing its marker and before moving the file there.
            let inbox = directory("inbox")
            try Data((inbox + "/report.txt").utf8).write(
                to: URL(fileURLWithPath: path + "/files.files/\(sent.id).delivered")
            )
            let received = Locked<[ReceivedFile]>([])
            let errors = Locked<[WormholeError]>([])
            let receiver = try transfers.receive(
                consumer: "r",
                into: inbox,
                on: .notifierThread,
                errorHandler: { error in errors.withLock { $0.append(error) } }
            ) { file in received.withLock { $0.append(file) } }
            receiver.cancel()
            #expect(errors.withLock { $0 }.isEmpty)
            let file = try #require(received.withLock { $0 }.first)
            #expect(FileManager.default.contents(atPath: file.path) == Data("hello".utf8))
        }
    }
}
