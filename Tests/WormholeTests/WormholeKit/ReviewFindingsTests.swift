import Foundation
import Testing

@testable import WormholeKit

/// Faults found by reading the code against FORMAT.md, each kept as a test.
@Suite("Review findings", .limit(minutes: 3))
struct ReviewFindingsTests {
    let directory = TemporaryDirectory()
    var path: String { directory("wormhole") }

    @Test("A mailbox file of a newer format version is refused, not overwritten")
    func newerVersionIsKept() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: path)
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            let file = path + "/button.msg"
            var bytes = try Data(contentsOf: URL(fileURLWithPath: file))
            bytes[4] = 2  // the format version, little-endian, after the magic
            try bytes.write(to: URL(fileURLWithPath: file))
            let error = #expect(throws: WormholeError.self) {
                try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            }
            #expect(error?.code == .unsupportedFormatVersion)
            #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == bytes, "the newer writer's file is unchanged")
        }
    }

    @Test("A transfer whose name or id would leave its directory is refused and nothing is written outside")
    func transferNamesCannotEscape() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: path)
            let transfers = try wormhole.transfers("files")
            let inbox = directory("inbox")
            // What a hostile process could enqueue by hand on the channel's queue.
            let queue = try wormhole.queue("files.transfers")
            for (id, name) in [
                (UUID().uuidString.lowercased(), "../escaped"), ("../../escaped", "report.pdf"),
                (UUID().uuidString.lowercased(), "/tmp/escaped"),
            ] {
                try queue.enqueue(FileTransfer(id: id, name: name, size: 1, metadata: [:], sender: "mallory"))
            }
            let errors = Collector<WormholeError.Code>()
            let received = Collector<String>()
            let receiver = try transfers.receive(
                consumer: "viewer",
                into: inbox,
                on: .notifierThread,
                errorHandler: { errors.append($0.code) }
            ) { file in received.append(file.path) }
            #expect(eventually { errors.count == 3 })
            receiver.cancel()
            #expect(errors.values.allSatisfy { $0 == .invalidIdentifier })
            #expect(received.values.isEmpty)
            #expect(!FileManager.default.fileExists(atPath: directory("escaped")))
            #expect(!FileManager.default.fileExists(atPath: "/tmp/escaped"))
        }
    }

    @Test("One damaged consumer position stops neither a reclaiming call nor the other consumers; it holds space back")
    func damagedPositionDoesNotBlockReclaiming() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: path)
            let queue = try wormhole.queue("jobs")
            try queue.enqueueData(contentsOf: (0..<100).map { Data(repeating: UInt8($0), count: 100) })
            let handled = Collector<Int>()
            let worker = try queue.consumeData(consumer: "worker", on: .notifierThread) {
                handled.append($0.payload.count)
            }
            #expect(eventually { handled.count == 100 })
            worker.cancel()
            try Data("damaged".utf8).write(to: URL(fileURLWithPath: path + "/jobs.consumers/broken"))
            try queue.reclaimSpace()
            // Where the damaged consumer stood is unknown: nothing is punched under it (a hole reads as zeros).
            let log = try FileHandle(forReadingFrom: URL(fileURLWithPath: path + "/jobs.queue"))
            #expect(try log.read(upToCount: 4) != Data(count: 4))
            try log.close()
            // The worker goes on from where it was: it gets the new messages only.
            try queue.enqueueData(Data(repeating: 1, count: 7))
            let again = try queue.consumeData(consumer: "worker", on: .notifierThread) {
                handled.append($0.payload.count)
            }
            #expect(eventually { handled.count == 101 })
            again.cancel()
            #expect(handled.values.last == 7)
        }
    }

    @Test("A consumer at work on a quiet queue is not dropped by reclaiming, however long since it wrote its position")
    func consumerAtWorkIsNotDropped() async throws {
        try await offThePool {
            // A retention of 4 s: the running consumer marks its file every second, holding no lock between marks.
            let queue = try Wormhole(directory: path).queue("jobs", retention: .seconds(4))
            let handled = Collector<Int>()
            var waiting: QueueConsumer? = try queue.consumeData(consumer: "waiting", on: .notifierThread) {
                handled.append($0.payload.count)
            }
            // Its file last written 8 days ago, far beyond the retention: a week with nothing to consume. The next mark
            // (within a second) makes it seen again.
            let file = path + "/jobs.consumers/waiting"
            let weekAgo = Date().addingTimeInterval(-8 * 24 * 3600)
            try FileManager.default.setAttributes([.modificationDate: weekAgo], ofItemAtPath: file)
            usleep(1_600_000)
            try queue.reclaimSpace()
            #expect(FileManager.default.fileExists(atPath: file))
            try queue.enqueueData(Data(count: 5))
            #expect(eventually { handled.values == [5] })
            waiting?.cancel()
            waiting = nil
            // Gone, and as old: now it is dropped.
            try FileManager.default.setAttributes([.modificationDate: weekAgo], ofItemAtPath: file)
            #expect(
                eventually {
                    (try? queue.reclaimSpace()) != nil && !FileManager.default.fileExists(atPath: file)
                }
            )
        }
    }

    @Test("A queue handler can read its consumer's position without waiting for itself")
    func positionFromAHandler() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: path)
            let queue = try wormhole.queue("jobs")
            let consumer = Locked<QueueConsumer?>(nil)
            let positions = Collector<UInt64>()
            let started = try queue.consumeData(consumer: "worker", on: .serialQueue) { message in
                // Before, `position` took the lock the delivery holds: this handler waited for itself for ever.
                if let position = consumer.withLock({ $0 })?.position { positions.append(position) }
            }
            consumer.withLock { $0 = started }
            try queue.enqueueData(Data("one".utf8))
            try queue.enqueueData(Data("two".utf8))
            #expect(eventually { positions.count == 2 })
            #expect(eventually { started.position == (try? queue.status().endOffset) })
            started.cancel()
        }
    }

    @Test(
        "A transfer received on another file system is copied whole under its name, and nothing else is left",
        .enabled(if: FileManager.default.fileExists(atPath: "/dev/shm"), "needs /dev/shm, another file system")
    )
    func deliveryAcrossFileSystems() async throws {
        try await offThePool {
            let inbox = "/dev/shm/wormhole-test-inbox-\(UUID().uuidString)"
            defer { try? FileManager.default.removeItem(atPath: inbox) }
            let bytes = Data((0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
            let source = directory("report.bin")
            try bytes.write(to: URL(fileURLWithPath: source))
            let transfers = try Wormhole(directory: path).transfers("files")
            try transfers.send(file: source)
            let received = Collector<String>()
            let receiver = try transfers.receive(consumer: "viewer", into: inbox, on: .notifierThread) {
                received.append($0.path)
            }
            #expect(eventually { received.count == 1 })
            receiver.cancel()
            #expect(received.values == [inbox + "/report.bin"])
            #expect(try Data(contentsOf: URL(fileURLWithPath: inbox + "/report.bin")) == bytes)
            #expect(try FileManager.default.contentsOfDirectory(atPath: inbox) == ["report.bin"])
        }
    }
}
