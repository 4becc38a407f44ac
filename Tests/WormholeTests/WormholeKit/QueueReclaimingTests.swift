import Foundation
import Testing

@testable import WormholeKit

/// Reclaiming a queue's space while its consumers are damaged, quiet or inside their handlers.
@Suite("Durable queues: reclaiming around damaged, quiet and busy consumers", .limit(minutes: 3))
struct QueueReclaimingTests {
    let directory = TemporaryDirectory()
    var path: String { directory("wormhole") }

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
}
