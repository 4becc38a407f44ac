import Foundation
import Testing
import WormholeKit

/// The queue contract, for every engine (``QueueLog``).
///
/// Every message enqueued is kept, in order: each named consumer receives every message once, in append order, with
/// each producer's order kept, across restarts of either side. Appending a batch is atomic and ordered: consumers see
/// its messages together, with no other append in between. A consumer's position moves only when it acknowledges
/// (its handler returns, or its sequence asks for the next message or is told to acknowledge): a consumer restarted
/// under the same name gets nothing it acknowledged and catches up on what came while it was away. What a handler
/// that throws leads to (attempts, back-off, dead letters) is `QueueRetryContract`'s.
/// ``WormholeQueue/status()`` tells each consumer's position and lag.
@Suite("Contract: queues", .limit(minutes: 3))
struct QueueContract {
    struct Job: Codable, Sendable, Equatable, Hashable {
        var producer: String
        var batch: Int = 0
        var index: Int
    }

    @Test(
        "Two producers × 200: two consumers each get every message once, each producer's order kept",
        arguments: EngineKind.underTest
    )
    func producersAndConsumers(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let count = 200
            let received = [Collector<QueueMessage<Job>>(), Collector<QueueMessage<Job>>()]
            let consumers = try (0..<2).map { index in
                try fixture.wormhole("consumer-\(index)").queue("jobs").consume(consumer: "c\(index)", as: Job.self) {
                    received[index].append($0)
                }
            }
            let producers = try ["left", "right"].map { try fixture.wormhole($0).queue("jobs") }
            let failures = Collector<String>()
            DispatchQueue.concurrentPerform(iterations: 2) { index in
                let name = index == 0 ? "left" : "right"
                for job in 0..<count {
                    do { try producers[index].enqueue(Job(producer: name, index: job)) } catch {
                        failures.append("\(error)")
                    }
                }
            }
            #expect(failures.values.isEmpty)

            for (index, collector) in received.enumerated() {
                #expect(eventually { collector.count >= 2 * count }, "consumer c\(index) gets all \(2 * count)")
            }
            // A last message marks the end: nothing before it may arrive after it.
            try producers[0].enqueue(Job(producer: "end", index: 0))
            for collector in received { #expect(eventually { collector.values.last?.value.producer == "end" }) }

            for (index, collector) in received.enumerated() {
                let messages = collector.values.dropLast()
                let jobs = messages.map(\.value)
                #expect(jobs.count == 2 * count, "c\(index): exactly once")
                #expect(Set(jobs).count == jobs.count, "c\(index): no message twice")
                for name in ["left", "right"] {
                    #expect(
                        jobs.filter { $0.producer == name }.map(\.index) == Array(0..<count),
                        "c\(index): \(name)'s order"
                    )
                    #expect(messages.filter { $0.value.producer == name }.allSatisfy { $0.sender == name })
                }
                let offsets = messages.map(\.offset)
                #expect(zip(offsets, offsets.dropFirst()).allSatisfy { $0 < $1 }, "c\(index): offsets grow")
            }
            #expect(received[0].values.map(\.value) == received[1].values.map(\.value), "one order for every consumer")
            for consumer in consumers { consumer.cancel() }
        }
    }

    @Test(
        "A consumer restarted under its name gets nothing acknowledged and catches up on what came while away",
        arguments: EngineKind.underTest
    )
    func restartedConsumer(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            for job in 0..<10 { try producer.enqueue(job) }

            let received = Collector<Int>()
            let first = try fixture.wormhole("worker").queue("jobs").consume(consumer: "worker", as: Int.self) {
                received.append($0.value)
            }
            #expect(eventually { received.count == 10 })
            first.cancel()
            #expect(first.isCancelled)

            // Away: ten more.
            for job in 10..<20 { try producer.enqueue(job) }
            #expect(received.values == Array(0..<10), "a cancelled consumer handles nothing more")

            let second = try fixture.wormhole("worker-again").queue("jobs").consume(consumer: "worker", as: Int.self) {
                received.append($0.value)
            }
            #expect(eventually { received.count >= 20 })
            try producer.enqueue(20)  // live again, after catching up
            #expect(eventually { received.values.last == 20 })
            #expect(received.values == Array(0...20), "none twice, none lost, in order")
            second.cancel()
        }
    }

    @Test("enqueue(contentsOf:) batches arrive contiguous, in order", arguments: EngineKind.underTest)
    func contiguousBatches(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let batchSize = 8
            let batches = 25
            let received = Collector<Job>()
            let consumer = try fixture.wormhole("worker").queue("batches").consume(consumer: "worker", as: Job.self) {
                received.append($0.value)
            }
            let producers = try ["left", "right"].map { try fixture.wormhole($0).queue("batches") }
            let failures = Collector<String>()
            DispatchQueue.concurrentPerform(iterations: 2) { index in
                let name = index == 0 ? "left" : "right"
                for batch in 0..<batches {
                    let jobs = (0..<batchSize).map { Job(producer: name, batch: batch, index: $0) }
                    do { try producers[index].enqueue(contentsOf: jobs) } catch { failures.append("\(error)") }
                }
            }
            #expect(failures.values.isEmpty)
            #expect(eventually { received.count >= 2 * batches * batchSize })

            let jobs = received.values
            #expect(jobs.count == 2 * batches * batchSize)
            var seenBatches: [String: [Int]] = [:]
            for start in stride(from: 0, to: jobs.count, by: batchSize) {
                let chunk = Array(jobs[start..<min(jobs.count, start + batchSize)])
                let head = chunk[0]
                #expect(
                    chunk == (0..<batchSize).map { Job(producer: head.producer, batch: head.batch, index: $0) },
                    "a batch arrives whole, with nothing between its messages: \(chunk)"
                )
                seenBatches[head.producer, default: []].append(head.batch)
            }
            #expect(seenBatches["left"] == Array(0..<batches))
            #expect(seenBatches["right"] == Array(0..<batches))
            consumer.cancel()
        }
    }

    @Test(
        "The AsyncSequence: acknowledging the 3rd and breaking, a new sequence starts at the 4th",
        arguments: EngineKind.underTest
    )
    func asyncSequence(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        try fixture.wormhole("app").queue("jobs").enqueue(contentsOf: 0..<6)
        let reader = try fixture.wormhole("worker").queue("jobs")

        let first = try await reader.messages(consumer: "worker", as: Int.self)
        var taken: [Int] = []
        for try await message in first {
            taken.append(message.value)
            #expect(message.sender == "app")
            if taken.count == 3 {
                try await first.acknowledge(message)
                break
            }
        }
        #expect(taken == [0, 1, 2])

        // The 4th, taken and left without acknowledging, is delivered again.
        let second = try await fixture.wormhole("worker-again").queue("jobs").messages(consumer: "worker", as: Int.self)
        var secondIterator = second.makeAsyncIterator()
        #expect(try await secondIterator.next()?.value == 3)

        let third = try await reader.messages(consumer: "worker", as: Int.self)
        var rest: [Int] = []
        for try await message in third {
            rest.append(message.value)
            if message.value == 5 {
                try await third.acknowledge(message)
                break
            }
        }
        #expect(rest == [3, 4, 5])
        let status = try reader.status()
        #expect(status.consumers.first { $0.name == "worker" }?.lagMessages == 0)
    }

    @Test("Invalid queue and consumer names are refused with .invalidIdentifier", arguments: EngineKind.underTest)
    func invalidNames(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let wormhole = try fixture.wormhole("app")
        #expect(wormholeError { _ = try wormhole.queue("../jobs") }?.code == .invalidIdentifier)
        let queue = try wormhole.queue("jobs")
        try queue.enqueue(1)
        let consuming = wormholeError { _ = try queue.consume(consumer: "a/b", as: Int.self) { _ in } }
        #expect(consuming?.code == .invalidIdentifier)
        let sequence = await wormholeErrorAwaiting {
            _ = try await queue.messages(consumer: ".hidden", as: Int.self)
        }
        #expect(sequence?.code == .invalidIdentifier, "refused at once")
        #expect(try queue.status().consumers.isEmpty, "no consumer was registered")
    }

    @Test("status() tells each consumer's position and lag", arguments: EngineKind.underTest)
    func status(kind: EngineKind) async throws {
        let fixture = try EngineFixture(kind)
        let producer = try fixture.wormhole("app").queue("jobs")
        let reader = try fixture.wormhole("worker").queue("jobs")
        let lagging = try await reader.messages(consumer: "lagger", as: Int.self)  // registers the consumer
        try producer.enqueue(contentsOf: 0..<5)

        let start = try producer.status()
        #expect(start.identifier == "jobs")
        let lagger = try #require(start.consumers.first { $0.name == "lagger" })
        #expect(lagger.lagMessages == 5)
        #expect(lagger.lagBytes > 0)
        #expect(lagger.offset < start.endOffset)

        var iterator = lagging.makeAsyncIterator()
        #expect(try await iterator.next()?.value == 0)
        func lag() throws -> Int? { try producer.status().consumers.first { $0.name == "lagger" }?.lagMessages }
        #expect(try lag() == 5, "taking a message is not acknowledging it")
        let second = try #require(try await iterator.next())
        #expect(second.value == 1)
        #expect(try lag() == 4, "asking for the next message acknowledges the one before")
        try await lagging.acknowledge(second)
        let afterTwo = try #require(try producer.status().consumers.first { $0.name == "lagger" })
        #expect(afterTwo.lagMessages == 3)
        #expect(afterTwo.offset == second.end)
        #expect(afterTwo.lagBytes > 0 && afterTwo.lagBytes < lagger.lagBytes)

        // A consumer that has handled everything lags by nothing.
        let handled = Collector<Int>()
        let worker = try reader.consume(consumer: "worker", as: Int.self) { handled.append($0.value) }
        #expect(
            await eventuallyAwaiting {
                (try? producer.status().consumers.first { $0.name == "worker" }?.lagMessages) == 0
            }
        )
        let end = try producer.status()
        let caughtUp = try #require(end.consumers.first { $0.name == "worker" })
        #expect(handled.values == Array(0..<5))
        #expect(caughtUp.lagBytes == 0)
        #expect(caughtUp.offset == end.endOffset)
        #expect(end.consumers.map(\.name) == ["lagger", "worker"])
        worker.cancel()
    }
}
