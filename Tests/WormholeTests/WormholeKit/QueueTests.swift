import Foundation
import Synchronization
import Testing

@testable import WormholeKit

struct Job: Codable, Sendable, Equatable {
    var writer: String
    var index: Int
}

/// Durable queues with real processes: producers and consumers are the `wormhole` tool, killed with SIGKILL where
/// the test says so.
@Suite("Durable queues", .limit(minutes: 3))
struct QueueTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }
    func makeQueue(_ identifier: String = "jobs") throws -> WormholeQueue {
        try Wormhole(directory: directory("wormhole")).queue(identifier)
    }

    @Test("Every message, in order, to each of several consumers; a consumer away catches up, then goes on live")
    func everyMessageToEveryConsumer() async throws {
        try await offThePool {
            let queue = try makeQueue()
            for index in 0..<5 { try queue.enqueue(Job(writer: "here", index: index)) }
            let first = Collector<Int>()
            let a = try queue.consume(consumer: "a", as: Job.self) { first.append($0.value.index) }
            #expect(eventually { first.values == [0, 1, 2, 3, 4] })
            for index in 5..<8 { try queue.enqueue(Job(writer: "here", index: index)) }
            #expect(eventually { first.values == Array(0..<8) })
            a.cancel()
            // "b" registers late: it starts from the oldest message kept, as nothing was reclaimed yet.
            let second = Collector<Int>()
            let b = try queue.consume(consumer: "b", as: Job.self) { second.append($0.value.index) }
            #expect(eventually { second.values == Array(0..<8) })
            // "a" was away for two messages: it catches up, without seeing anything twice.
            for index in 8..<10 { try queue.enqueue(Job(writer: "here", index: index)) }
            let again = Collector<Int>()
            let a2 = try queue.consume(consumer: "a", as: Job.self) { again.append($0.value.index) }
            #expect(eventually { again.values == [8, 9] })
            #expect(eventually { second.values == Array(0..<10) })
            let status = try queue.status()
            #expect(status.consumers.map(\.name) == ["a", "b"])
            #expect(eventually { (try? queue.status().consumers.allSatisfy { $0.lagMessages == 0 }) == true })
            _ = (b, a2)
        }
    }

    @Test("Each message keeps its own sender, when senders of the same length alternate and when one is empty")
    func sendersAlternate() async throws {
        try await offThePool {
            let root = directory("wormhole")
            let producers = try ["ab", "ac", "", "ab"].map { sender in
                var configuration = Wormhole.Configuration()
                configuration.sender = sender
                return try Wormhole(directory: root, configuration: configuration).queue("jobs")
            }
            for round in 0..<3 {
                for (index, producer) in producers.enumerated() {
                    try producer.enqueue(Job(writer: "p\(index)", index: round))
                }
            }
            try producers[1].enqueueData(contentsOf: [Data([1]), Data([2])])
            let received = Collector<(sender: String, writer: String?)>()
            let consumer = try makeQueue().consumeData(consumer: "all") { message in
                let job = try? JSONDecoder().decode(Job.self, from: message.payload)
                received.append((message.sender, job?.writer))
            }
            #expect(eventually { received.count == 14 })
            let expected = ["ab", "ac", "", "ab"]
            for (position, item) in received.values.prefix(12).enumerated() {
                #expect(item.sender == expected[position % 4], "message \(position)")
                #expect(item.writer == "p\(position % 4)", "message \(position)")
            }
            #expect(received.values.suffix(2).map(\.sender) == ["ac", "ac"])
            consumer.cancel()
        }
    }

    @Test("A payload a handler keeps, or hands to another thread, never changes when the next message comes")
    func keptPayloadsStay() async throws {
        try await offThePool {
            let queue = try makeQueue()
            // Sizes that grow and shrink between 15 and 1,024 bytes, two messages of each in a row, where the consumer
            // writes a payload into the last one's memory when nothing holds it; a few past that, which get memory of
            // their own.
            let payloads = (0..<300).map { index in
                let size = index % 50 == 7 ? 2_000 : 15 + (index / 2 * 37) % 1_010
                return Data((0..<size).map { UInt8(truncatingIfNeeded: index &* 7 &+ $0) })
            }
            try queue.enqueueData(contentsOf: payloads)
            // Most payloads are copied out and let go, so that the next one is written in place; every third is kept
            // as it was handed over, and read again on another thread a millisecond later.
            let received = Collector<[UInt8]>()
            let changed = Collector<Int>()
            let handedOn = Atomic<Int>(0)
            let elsewhere = DispatchQueue(label: "kept-payloads")
            let consumer = try queue.consumeData(consumer: "keeper", on: .notifierThread) { message in
                let index = received.count
                received.append(Array(message.payload))
                if index % 3 == 0 {
                    let payload = message.payload
                    elsewhere.asyncAfter(deadline: .now() + .milliseconds(1)) {
                        if payload != payloads[index] { changed.append(index) }
                        handedOn.add(1, ordering: .relaxed)
                    }
                }
            }
            #expect(eventually { received.count == payloads.count })
            #expect(received.values == payloads.map { Array($0) })
            #expect(eventually { handedOn.load(ordering: .relaxed) == payloads.count / 3 })
            #expect(changed.values.isEmpty, "payloads changed after they were handed over: \(changed.values)")
            consumer.cancel()
        }
    }

    @Test("4 producer processes × 10,000 messages: all delivered, each producer's order kept, no duplicates")
    func manyProducers() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let received = Collector<Job>()
            let consumer = try queue.consume(consumer: "all", as: Job.self, on: .notifierThread) {
                received.append($0.value)
            }
            let producers = try (0..<4).map { index in
                try RunningTool(
                    ["exercise", "enqueue", "--count", "10000", "--identifier", "jobs", "--tag", "p\(index)"] + location
                )
            }
            for producer in producers { #expect(producer.finish(timeout: 120).status == 0) }
            #expect(eventually(timeout: 60) { received.count >= 40_000 })
            consumer.cancel()
            let jobs = received.values
            #expect(jobs.count == 40_000, "no duplicates")
            for producer in 0..<4 {
                let indices = jobs.filter { $0.writer == "p\(producer)" }.map(\.index)
                #expect(indices == Array(0..<10_000), "producer p\(producer) in order, complete")
            }
        }
    }

    @Test("4 producer processes × 10,000 messages in batches of 100, consumed in batches: none lost, batches whole")
    func batches() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let received = Collector<Job>()
            let batchSizes = Collector<Int>()
            let consumer = try queue.consumeBatches(
                consumer: "all",
                as: Job.self,
                maximumCount: 500,
                on: .notifierThread
            ) {
                batchSizes.append($0.count)
                for message in $0 { received.append(message.value) }
            }
            let producers = try (0..<4).map { index in
                try RunningTool(
                    [
                        "exercise", "enqueue", "--count", "10000", "--batch", "100", "--identifier", "jobs", "--tag",
                        "p\(index)",
                    ]
                        + location
                )
            }
            for producer in producers { #expect(producer.finish(timeout: 120).status == 0) }
            #expect(eventually(timeout: 60) { received.count >= 40_000 })
            consumer.cancel()
            let jobs = received.values
            #expect(jobs.count == 40_000, "no duplicates")
            #expect(batchSizes.values.allSatisfy { $0 >= 1 && $0 <= 500 })
            for producer in 0..<4 {
                let indices = jobs.filter { $0.writer == "p\(producer)" }.map(\.index)
                #expect(indices == Array(0..<10_000), "producer p\(producer) in order, complete")
            }
            // One write per batch: another producer's messages never come between a batch's messages.
            for (position, job) in jobs.enumerated() where job.index % 100 != 99 {
                #expect(jobs[position + 1] == Job(writer: job.writer, index: job.index + 1))
            }
        }
    }

    @Test(
        "In strict order, a batch whose handler throws is offered again whole; an acknowledged batch never comes back"
    )
    func batchRetry() async throws {
        try await offThePool {
            let queue = try makeQueue()
            try queue.enqueue(contentsOf: (0..<5).map { Job(writer: "here", index: $0) })
            let attempts = Collector<[String]>()
            let errors = Collector<WormholeError.Code>()
            struct Refused: Error {}
            let consumer = try queue.consumeBatches(
                consumer: "c",
                as: Job.self,
                retry: QueueRetryPolicy(firstDelay: .milliseconds(50), order: .strict),
                on: .notifierThread,
                errorHandler: { errors.append($0.code) }
            ) { batch in
                attempts.append(batch.map { "\($0.value.index)#\($0.attempt)" })
                if attempts.count == 1 { throw Refused() }
            }
            #expect(eventually { attempts.values.count == 2 })
            #expect(attempts.values == [["0#1", "1#1", "2#1", "3#1", "4#1"], ["0#2", "1#2", "2#2", "3#2", "4#2"]])
            #expect(errors.values == [.handlerFailed])
            consumer.cancel()
            // Acknowledged: a consumer of the same name starts after it.
            try queue.enqueue(Job(writer: "here", index: 6))
            let later = Collector<Int>()
            let again = try queue.consumeBatches(consumer: "c", as: Job.self, on: .notifierThread) { batch in
                for message in batch { later.append(message.value.index) }
            }
            #expect(eventually { later.values == [6] })
            again.cancel()
            #expect(try queue.status().consumers.first?.lagMessages == 0)
        }
    }

    @Test("A consumer killed while handling a message gets it again; the acknowledged one never comes back")
    func consumerKilledMidMessage() async throws {
        try await offThePool {
            let queue = try makeQueue()
            for index in 0..<3 { try queue.enqueue(Job(writer: "here", index: index)) }
            let crashing = try WormholeTool.run(
                ["exercise", "consume-then-crash", "--identifier", "jobs", "--tag", "worker"] + location,
                timeout: 30
            )
            #expect(crashing.status != 0, "it killed itself")
            #expect(crashing.lines == ["handled 0", "handled 1"])
            let after = Collector<Int>()
            let consumer = try queue.consume(consumer: "worker", as: Job.self) { after.append($0.value.index) }
            #expect(eventually { after.values == [1, 2] })
            consumer.cancel()
        }
    }

    @Test("Consumers with failing messages killed at random: every message is handled or a dead letter, none lost")
    func retryingConsumersKilledAtRandom() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let total = 300
            try queue.enqueueData(contentsOf: (0..<total).map { Data(#"{"n":\#($0)}"#.utf8) })
            // Every tenth message fails at each attempt: it must end a dead letter. Every tenth but three fails at its
            // first attempt only: it must end handled, after a retry.
            let script =
                #"read line; n=$(printf %s "$line" | tr -cd 0-9); "#
                + #"if [ $((n % 10)) -eq 3 ]; then echo "poison $n" >&2; exit 1; fi; "#
                + #"if [ $((n % 10)) -eq 6 ] && [ "$WORMHOLE_ATTEMPT" = 1 ]; then exit 1; fi; "#
                + #"echo "ok $n $WORMHOLE_ATTEMPT""#
            let arguments =
                ["consume"] + location
                + ["jobs", "--consumer", "w", "--exec", script, "--max-attempts", "2", "--backoff", "20ms"]
            var handled: [(index: Int, attempt: Int)] = []
            func parse(_ lines: [String]) -> [(index: Int, attempt: Int)] {
                lines.compactMap { line in
                    let parts = line.split(separator: " ")
                    guard parts.count == 3, parts[0] == "ok", let index = Int(parts[1]), let attempt = Int(parts[2])
                    else { return nil }
                    return (index, attempt)
                }
            }
            for _ in 0..<8 {
                let consumer = try RunningTool(arguments)
                usleep(UInt32.random(in: 30_000...200_000))
                consumer.kill()
                handled += parse(consumer.finish().lines)
            }
            // The last one drains what is left, retries included, until nothing lags or waits.
            let last = try RunningTool(arguments)
            #expect(
                eventually(timeout: 60) {
                    let consumer = try? queue.status().consumers.first
                    return consumer?.lagMessages == 0 && consumer?.waitingForRetry == 0
                }
            )
            usleep(200_000)
            last.kill()
            handled += parse(last.finish().lines)
            let poison = Set((0..<total).filter { $0 % 10 == 3 })
            let flaky = Set((0..<total).filter { $0 % 10 == 6 })
            let dead = try queue.deadLetters(consumer: "w").list().map {
                try JSONDecoder().decode(JSONValue.self, from: $0.payload)["n"]?.intValue ?? -1
            }
            let handledIndices = handled.map(\.index)
            #expect(Set(handledIndices) == Set(0..<total).subtracting(poison), "every good message handled")
            #expect(Set(dead) == poison, "every poison message a dead letter, and only those")
            #expect(
                handled.filter { flaky.contains($0.index) }.allSatisfy { $0.attempt == 2 },
                "a message that failed its first attempt is handled at its second"
            )
            // A kill repeats at most the message in flight (handled, not yet acknowledged).
            #expect(handledIndices.count - Set(handledIndices).count <= 9)
        }
    }

    @Test("Consumers killed at random points never skip a message and repeat only the one in flight")
    func consumersKilledAtRandom() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let total = 3000
            for index in 0..<total { try queue.enqueue(Job(writer: "here", index: index)) }
            var printed: [Int] = []
            var kills = 0
            while printed.last != total - 1 {
                let consumer = try RunningTool(
                    ["consume", "jobs", "--consumer", "worker", "--count", String(total)] + location
                )
                usleep(UInt32.random(in: 20_000...120_000))
                consumer.kill()
                kills += 1
                let lines = consumer.finish().lines.compactMap {
                    try? JSONDecoder().decode(Job.self, from: Data($0.utf8)).index
                }
                printed += lines
                #expect(kills < 200, "the consumer makes progress")
                if kills >= 200 { break }
            }
            // Each kill can repeat at most the message that was printed but not yet acknowledged.
            #expect(Set(printed) == Set(0..<total), "nothing skipped")
            #expect(
                printed.count - total <= kills,
                "repeats only the message in flight: \(printed.count - total) for \(kills) kills"
            )
            #expect(
                zip(printed, printed.dropFirst()).allSatisfy { $1 >= $0 },
                "never goes back past an acknowledged message"
            )
        }
    }

    @Test("Producers killed mid-append leave torn records that are never delivered; what follows still is")
    func producersKilledMidAppend() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let received = Collector<Job>()
            let errors = Collector<WormholeError>()
            let consumer = try queue.consume(
                consumer: "all",
                as: Job.self,
                on: .notifierThread,
                errorHandler: { errors.append($0) }
            ) { received.append($0.value) }
            for round in 0..<20 {
                let producer = try RunningTool(
                    ["exercise", "enqueue", "--count", "1000000", "--identifier", "jobs", "--tag", "k\(round)"]
                        + location
                )
                usleep(UInt32.random(in: 10_000...40_000))
                producer.kill()
                _ = producer.finish()
            }
            // Plant a torn record by hand too: a whole record cut short.
            let record = Array(#"{"writer":"torn","index":0}"#.utf8).withUnsafeBytes {
                QueueFormat.encode(payload: $0, sender: [], timestampNanoseconds: 0)
            }
            let handle = try #require(FileHandle(forWritingAtPath: directory("wormhole/jobs.queue")))
            handle.seekToEndOfFile()
            handle.write(Data(record.prefix(record.count - 5)))
            try handle.close()
            try queue.enqueue(Job(writer: "last", index: 0))
            #expect(eventually(timeout: 60) { received.values.last == Job(writer: "last", index: 0) })
            consumer.cancel()
            let jobs = received.values
            #expect(!jobs.contains { $0.writer == "torn" })
            #expect(errors.values.isEmpty, "torn records are stepped over, not reported as bad messages")
            for round in 0..<20 {
                let indices = jobs.filter { $0.writer == "k\(round)" }.map(\.index)
                #expect(indices == Array(0..<indices.count), "producer k\(round): a prefix of its messages, in order")
            }
        }
    }

    /// The bytes of a record of `size` bytes in all, its payload `fill` repeated.
    static func record(size: Int, fill: UInt8 = UInt8(ascii: "t")) -> [UInt8] {
        let payload = [UInt8](repeating: fill, count: size - QueueFormat.headerSize - QueueFormat.bodyPrefixSize)
        return payload.withUnsafeBytes { QueueFormat.encode(payload: $0, sender: [], timestampNanoseconds: 0) }
    }

    /// Appends bytes to the queue's log as a producer's `write` would.
    func append(_ bytes: [UInt8], to identifier: String = "jobs") throws {
        let handle = try #require(FileHandle(forWritingAtPath: directory("wormhole/\(identifier).queue")))
        handle.seekToEndOfFile()
        handle.write(Data(bytes))
        try handle.close()
    }

    @Test("A record after a torn one comes at once, not when later bytes cover the torn one's length")
    func recordAfterTornPrefix() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let received = Collector<String>()
            let errors = Collector<WormholeError>()
            let consumer = try queue.consumeData(
                consumer: "c",
                on: .notifierThread,
                errorHandler: { errors.append($0) }
            ) {
                received.append(String(decoding: $0.value, as: UTF8.self))
            }
            try queue.enqueue("A")
            #expect(eventually(timeout: 5) { received.values == [#""A""#] })
            // A producer killed 100 bytes into the write of a 2,000-byte record.
            try append(Array(Self.record(size: 2000).prefix(100)))
            try queue.enqueue("B")
            #expect(eventually(timeout: 5) { received.values == [#""A""#, #""B""#] })
            consumer.cancel()
            #expect(errors.values.isEmpty)
            // A consumer that starts afterwards, and the command line, step over it too.
            let tool = try WormholeTool.run(
                ["consume"] + location + ["jobs", "--consumer", "d", "--count", "2", "--timeout", "10"]
            )
            #expect(tool.status == 0, "\(tool.error)")
            #expect(tool.lines == [#""A""#, #""B""#])
            #expect(try queue.status().consumers.first { $0.name == "c" }?.lagMessages == 0)
        }
    }

    @Test("A record still being written is waited for, not stepped over, however long it takes")
    func recordBeingWritten() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let received = Collector<Int>()
            let consumer = try queue.consumeData(consumer: "c", on: .notifierThread) { received.append($0.value.count) }
            try queue.enqueueData(Data("A".utf8))
            #expect(eventually(timeout: 5) { received.values == [1] })
            // A large record arrives in pieces, as a long write lands page by page; the reader wakes at each piece.
            let large = Self.record(size: 700_000)
            var written = 0
            for piece in [100, 5000, 300_000, 250_000] {
                try append(Array(large[written..<written + piece]))
                written += piece
                usleep(50_000)
                #expect(received.values == [1])
            }
            try append(Array(large[written...]))
            try queue.enqueueData(Data("B".utf8))
            #expect(eventually(timeout: 5) { received.values == [1, large.count - 22, 1] })
            consumer.cancel()
        }
    }

    @Test("A large record after a torn one is read whole, though it runs past the read that skipped the torn one")
    func largeRecordAfterTornOne() async throws {
        try await offThePool {
            let queue = try makeQueue()
            try queue.enqueueData(Data("A".utf8))
            // The torn record claims 300 KB, more than one read; the next record is longer still.
            try append(Array(Self.record(size: 300_000).prefix(100)))
            let large = Self.record(size: 400_000, fill: UInt8(ascii: "b"))
            try append(large)
            try queue.enqueueData(Data("C".utf8))
            let received = Collector<Int>()
            let consumer = try queue.consumeData(consumer: "c", on: .notifierThread) { received.append($0.value.count) }
            #expect(eventually(timeout: 5) { received.values == [1, large.count - 22, 1] })
            consumer.cancel()
        }
    }

    @Test("Space that every consumer has passed is reclaimed; the queue goes on working")
    func reclaimsSpace() async throws {
        try await offThePool {
            let queue = try makeQueue()
            let payload = String(repeating: "x", count: 1000)
            for index in 0..<8000 { try queue.enqueue(Job(writer: payload, index: index)) }
            let path = directory("wormhole/jobs.queue")
            func allocatedBytes() -> Int {
                var status = stat()
                stat(path, &status)
                return Int(status.st_blocks) * 512
            }
            let before = allocatedBytes()
            let received = Collector<Int>()
            let consumer = try queue.consume(consumer: "only", as: Job.self, on: .notifierThread) {
                received.append($0.value.index)
            }
            #expect(eventually { received.count == 8000 })
            consumer.cancel()
            try queue.reclaimSpace()
            #expect(allocatedBytes() < before / 2, "from \(before) to \(allocatedBytes()) bytes")
            // A new consumer starts after the reclaimed space; new messages flow as before.
            try queue.enqueue(Job(writer: "after", index: 1))
            let late = Collector<Job>()
            let fresh = try queue.consume(consumer: "only", as: Job.self) { late.append($0.value) }
            #expect(eventually { late.values == [Job(writer: "after", index: 1)] })
            fresh.cancel()
        }
    }

    @Test("The AsyncSequence delivers in order and acknowledges a message when the next is asked for")
    func asyncSequence() async throws {
        let queue = try makeQueue()
        for index in 0..<3 { try queue.enqueue(Job(writer: "here", index: index)) }
        var seen: [Int] = []
        for try await message in try await queue.messages(consumer: "seq", as: Job.self) {
            seen.append(message.value.index)
            if seen.count == 3 { break }
        }
        #expect(seen == [0, 1, 2])
        // The last one was not acknowledged (the loop broke out): it comes again.
        var iterator = try await queue.messages(consumer: "seq", as: Job.self).makeAsyncIterator()
        #expect(try await iterator.next()?.value.index == 2)
    }

    @Test("A message of another type is reported and goes to the dead letters; bad names are refused")
    func badInput() async throws {
        try await offThePool {
            let queue = try makeQueue()
            try queue.enqueue("not a job")
            try queue.enqueue(Job(writer: "here", index: 1))
            let received = Collector<Int>()
            let errors = Collector<WormholeError.Code>()
            let consumer = try queue.consume(consumer: "c", as: Job.self, errorHandler: { errors.append($0.code) }) {
                received.append($0.value.index)
            }
            #expect(eventually { received.values == [1] && errors.values == [.decodingFailed] })
            #expect(try queue.deadLetters(consumer: "c").list().map(\.reason) == [.undecodable])
            consumer.cancel()
            #expect(throws: WormholeError.self) { try queue.consume(consumer: "../x", as: Job.self) { _ in } }
            #expect(throws: WormholeError.self) { try Wormhole(directory: directory("wormhole")).queue("a/b") }
            let invalid = try WormholeTool.run(["enqueue"] + location + ["jobs", "{nope"])
            #expect(invalid.status == 2)
        }
    }

    @Test("consume --exec: a script is a consumer; a failing message goes to dead-letters, which retries and drops")
    func commandLineExec() async throws {
        try await offThePool {
            for message in [#"{"n":1}"#, #"{"n":"poison"}"#, #"{"n":3}"#] {
                #expect(try WormholeTool.run(["enqueue"] + location + ["jobs", message]).status == 0)
            }
            let script =
                #"read line; case "$line" in *poison*) echo "bad input" >&2; exit 3;; esac; "#
                + #"echo "done $WORMHOLE_OFFSET $WORMHOLE_ATTEMPT $line""#
            let run = try WormholeTool.run(
                ["consume"] + location
                    + ["jobs", "--consumer", "w", "--exec", script, "--max-attempts", "2", "--backoff", "50ms"]
                    + ["--timeout", "2"],
                timeout: 30
            )
            #expect(run.status == 0)
            #expect(run.lines.count == 2)
            #expect(run.lines.allSatisfy { $0.hasPrefix("done ") && $0.contains(" 1 {") }, "\(run.lines)")
            let listed = try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "w"])
            #expect(listed.lines.count == 1)
            let letter = try JSONDecoder().decode(JSONValue.self, from: Data((listed.lines.first ?? "").utf8))
            #expect(letter["message"]?["n"]?.stringValue == "poison")
            #expect(letter["attempts"]?.intValue == 2)
            #expect(letter["reason"]?.stringValue == "failed")
            #expect(letter["lastError"]?.stringValue?.contains("bad input") == true)
            let status = try WormholeTool.run(["queue-status"] + location + ["jobs"])
            let decoded = try JSONDecoder().decode(QueueStatus.self, from: Data(status.output.utf8))
            #expect(decoded.consumers.first?.deadLetters == 1)
            #expect(decoded.consumers.first?.waitingForRetry == 0)

            #expect(
                try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "w", "--retry"]).lines
                    == ["requeued 1"]
            )
            let again = try WormholeTool.run(
                ["consume"] + location + [
                    "jobs", "--consumer", "w", "--exec", "cat", "--count", "1", "--timeout", "10",
                ],
                timeout: 30
            )
            #expect(again.lines == [#"{"n":"poison"}"#])
            #expect(try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "w"]).lines.isEmpty)
            #expect(
                try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "w", "--drop"]).lines
                    == ["dropped 0"]
            )
            #expect(
                try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "w", "--offset", "1"])
                    .status == 64
            )
        }
    }

    @Test("enqueue --delay, --at and --expires-after from the command line")
    func commandLineSchedule() async throws {
        try await offThePool {
            let started = Date()
            #expect(try WormholeTool.run(["enqueue"] + location + ["jobs", #"{"n":1}"#, "--delay", "3s"]).status == 0)
            #expect(
                try WormholeTool.run(["enqueue"] + location + ["jobs", #"{"n":2}"#, "--at", "2000-01-01T00:00:00Z"])
                    .status == 0
            )
            #expect(
                try WormholeTool.run(["enqueue"] + location + ["jobs", #"{"n":3}"#, "--expires-after", "1ms"])
                    .status == 0
            )
            #expect(try WormholeTool.run(["enqueue"] + location + ["jobs", "{}", "--at", "nine"]).status == 64)
            usleep(50_000)
            let run = try WormholeTool.run(
                ["consume"] + location + ["jobs", "--consumer", "c", "--count", "2", "--timeout", "20"],
                timeout: 40
            )
            #expect(run.lines == [#"{"n":2}"#, #"{"n":1}"#], "a time passed: at once; a delay: after it")
            #expect(Date().timeIntervalSince(started) >= 3)
            let dead = try WormholeTool.run(["dead-letters"] + location + ["jobs", "--consumer", "c"])
            let letter = try JSONDecoder().decode(JSONValue.self, from: Data((dead.lines.first ?? "").utf8))
            #expect(letter["reason"]?.stringValue == "expired")
            #expect(letter["message"]?["n"]?.intValue == 3)
        }
    }

    @Test("enqueue, consume and queue-status from the command line")
    func commandLine() async throws {
        try await offThePool {
            for index in 0..<3 {
                #expect(
                    try WormholeTool.run(["enqueue"] + location + ["jobs", #"{"writer":"cli","index":\#(index)}"#])
                        .status
                        == 0
                )
            }
            let first = try WormholeTool.run(
                ["consume"] + location + ["jobs", "--consumer", "c", "--count", "2", "--timeout", "10"]
            )
            #expect(first.lines == [#"{"writer":"cli","index":0}"#, #"{"writer":"cli","index":1}"#])
            let status = try WormholeTool.run(["queue-status"] + location + ["jobs"])
            let decoded = try JSONDecoder().decode(QueueStatus.self, from: Data(status.output.utf8))
            #expect(decoded.consumers.map(\.lagMessages) == [1])
            let rest = try WormholeTool.run(
                ["consume"] + location + ["jobs", "--consumer", "c", "--count", "1", "--timeout", "10"]
            )
            #expect(rest.lines == [#"{"writer":"cli","index":2}"#])
            let timedOut = try WormholeTool.run(
                ["consume"] + location + ["jobs", "--consumer", "c", "--count", "1", "--timeout", "0.5"]
            )
            #expect(timedOut.status == 1)
        }
    }
}
