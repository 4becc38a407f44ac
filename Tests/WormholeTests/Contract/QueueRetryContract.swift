import Foundation
import Testing
import WormholeKit

/// The retry contract of queue consumers, for every engine (``QueueRetryPolicy``, ``WormholeDeadLetters``).
///
/// A handler that throws has failed an attempt: the message comes back after a back-off with its attempt number, at
/// most `maximumAttempts` times, then goes to the consumer's dead letters with its count and last error, and the
/// consumer moves on. In unordered order later messages flow past a message that waits; in strict order they wait.
/// ``QueueOutcome/later(_:)`` puts a message off without counting an attempt. Attempts, set-aside messages and dead
/// letters survive a restart of the consumer; a dead letter requeued is handled once.
@Suite("Contract: queue retries and dead letters", .limit(minutes: 3))
struct QueueRetryContract {
    /// Short waits, so that a test takes a fraction of a second per attempt.
    static let quick = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(40), jitter: 0)

    @Test(
        "A failed message comes back after its back-off with its attempt number, and later messages flow past it",
        arguments: EngineKind.underTest
    )
    func unorderedRetry(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let seen = Collector<String>()
            let handled = Collector<Int>()
            let errors = Collector<WormholeError>()
            // A back-off long enough that 2 and 3 are handled before 1's second attempt, even on a loaded machine.
            let policy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(400), jitter: 0)
            let consumer = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: policy,
                errorHandler: { errors.append($0) }
            ) { message in
                seen.append("\(message.value)#\(message.attempt)")
                if message.value == 1, message.attempt < 3 { throw ContractFailure() }
                handled.append(message.value)
            }
            try producer.enqueue(contentsOf: [1, 2, 3])
            #expect(eventually(timeout: 20) { handled.count == 3 })
            #expect(handled.values == [2, 3, 1], "2 and 3 flow past 1 while it waits")
            #expect(seen.values.filter { $0.hasPrefix("1#") } == ["1#1", "1#2", "1#3"])
            #expect(errors.values.map(\.code) == [.handlerFailed, .handlerFailed])
            #expect(errors.values.first?.underlyingError is ContractFailure)
            #expect(errors.values.first?.message.contains("attempt 1 of 3") == true)
            #expect(try producer.deadLetters(consumer: "worker").count == 0)
            usleep(150_000)
            #expect(handled.count == 3, "a message handled after a retry comes no more")
            consumer.cancel()
        }
    }

    @Test(
        "A poison message goes to the dead letters after its last attempt while the others flow; requeued, it is handled once",
        arguments: EngineKind.underTest
    )
    func poisonMessage(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let poisoned = Locked(true)
            let handled = Collector<Int>()
            let attempts = Collector<Int>()
            let consumer = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: Self.quick,
                errorHandler: { _ in }
            ) { message in
                if message.value == 7 {
                    attempts.append(message.attempt)
                    if poisoned.withLock({ $0 }) { throw ContractFailure() }
                }
                handled.append(message.value)
            }
            try producer.enqueue(contentsOf: Array(1...20))
            let deadLetters = try producer.deadLetters(consumer: "worker")
            #expect(eventually { (try? deadLetters.count) == 1 })
            #expect(eventually { handled.count == 19 })
            #expect(handled.values == Array(1...20).filter { $0 != 7 }, "every other message, in order")
            #expect(attempts.values == [1, 2, 3])
            let letter = try #require(try deadLetters.list().first)
            #expect(letter.attempts == 3)
            #expect(letter.reason == .failed)
            #expect(letter.lastError == ContractFailure().description)
            #expect(letter.sender.contains("app"))
            #expect(try JSONDecoder().decode(Int.self, from: letter.payload) == 7)
            let position = try producer.status().consumers.first?.offset
            #expect(position.map { letter.offset < $0 } == true, "the consumer moved past it")

            // Fixed, and requeued: handled once, from attempt 1, and gone from the dead letters.
            poisoned.withLock { $0 = false }
            #expect(try deadLetters.requeue() == 1)
            #expect(eventually { handled.count == 20 })
            #expect(handled.values.last == 7)
            #expect(attempts.values == [1, 2, 3, 1])
            #expect(try deadLetters.count == 0)
            usleep(150_000)
            #expect(handled.count == 20, "handled once")
            consumer.cancel()
        }
    }

    @Test("Strict order: later messages wait for the one that failed", arguments: EngineKind.underTest)
    func strictOrder(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let seen = Collector<String>()
            let consumer = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: Self.quick.ordered(.strict),
                errorHandler: { _ in }
            ) { message in
                seen.append("\(message.value)#\(message.attempt)")
                if message.value == 2, message.attempt < 2 { throw ContractFailure() }
            }
            try producer.enqueue(contentsOf: [1, 2, 3])
            #expect(eventually { seen.count == 4 })
            #expect(seen.values == ["1#1", "2#1", "2#2", "3#1"])

            // The last attempt fails: to the dead letters, and the next message goes on.
            let second = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "strict-poison",
                as: Int.self,
                retry: Self.quick.ordered(.strict),
                errorHandler: { _ in }
            ) { message in
                if message.value == 1 { throw ContractFailure() }
                seen.append("poison:\(message.value)")
            }
            #expect(eventually { seen.values.contains("poison:3") })
            #expect(seen.values.suffix(2) == ["poison:2", "poison:3"])
            #expect(try producer.deadLetters(consumer: "strict-poison").list().map(\.attempts) == [3])
            consumer.cancel()
            second.cancel()
        }
    }

    @Test(
        "later() puts a message off without counting an attempt, in either order",
        arguments: EngineKind.underTest
    )
    func putOff(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            for order in [QueueRetryPolicy.Order.unordered, .strict] {
                let seen = Collector<String>()
                let putOff = Locked<ContinuousClock.Instant?>(nil)
                let waited = Locked<Duration?>(nil)
                let consumer = try fixture.wormhole("worker").queue("jobs").process(
                    consumer: "later-\(order)",
                    as: Int.self,
                    retry: Self.quick.ordered(order)
                ) { message in
                    if message.value == 1 {
                        guard let first = putOff.withLock({ $0 }) else {
                            putOff.withLock { $0 = .now }
                            return .later(.milliseconds(300))
                        }
                        waited.withLock { $0 = ContinuousClock.now - first }
                    }
                    seen.append("\(message.value)#\(message.attempt)")
                    return .done
                }
                if order == .unordered { try producer.enqueue(contentsOf: [1, 2]) }
                #expect(eventually { seen.count == 2 })
                let wait = waited.withLock { $0 }
                #expect(
                    wait.map { $0 >= .milliseconds(290) } == true,
                    "put off for its time: \(String(describing: wait))"
                )
                let expected = order == .unordered ? ["2#1", "1#1"] : ["1#1", "2#1"]
                #expect(seen.values == expected, "\(order): the attempt is not counted")
                consumer.cancel()
            }
        }
    }

    @Test(
        "Strict batches: a message that waits is never skipped, and messages at different attempts never share a batch",
        arguments: EngineKind.underTest
    )
    func strictBatches(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let batches = Collector<[String]>()
            let consumer = try fixture.wormhole("worker").queue("jobs").consumeBatches(
                consumer: "worker",
                as: Int.self,
                retry: QueueRetryPolicy(maximumAttempts: 3, firstDelay: .milliseconds(150), jitter: 0, order: .strict),
                errorHandler: { _ in }
            ) { messages in
                batches.append(messages.map { "\($0.value)#\($0.attempt)" })
                if messages.contains(where: { $0.value == 1 }) { throw ContractFailure() }
            }
            try producer.enqueue(1)
            #expect(eventually { batches.count == 1 })
            // Appended while 1 waits for its second attempt: it is fresh, 1 is not, so they go apart.
            try producer.enqueue(2)
            #expect(eventually { batches.values.last == ["2#1"] })
            #expect(batches.values == [["1#1"], ["1#2"], ["1#3"], ["2#1"]])
            #expect(try producer.deadLetters(consumer: "worker").list().map(\.attempts) == [3])
            usleep(300_000)
            #expect(batches.count == 4, "nothing comes again")
            #expect(try producer.status().consumers.first?.lagMessages == 0)
            consumer.cancel()
        }
    }

    @Test("A requeued message put off in strict order waits for its time", arguments: EngineKind.underTest)
    func putOffRequeued(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            try producer.enqueueData(Data("not a number".utf8))
            // A dead letter: the message cannot be decoded as this consumer's type.
            let typed = try fixture.wormhole("typed").queue("jobs").consume(
                consumer: "typed",
                as: Int.self,
                errorHandler: { _ in }
            ) { _ in }
            let dead = try producer.deadLetters(consumer: "typed")
            #expect(eventually { (try? dead.count) == 1 })
            typed.cancel()
            let requeuedCalls = Collector<Int>()
            let strict = try fixture.wormhole("typed-again").queue("jobs").processData(
                consumer: "typed",
                retry: Self.quick.ordered(.strict),
                errorHandler: { _ in }
            ) { message in
                requeuedCalls.append(message.attempt)
                return requeuedCalls.count == 1 ? .later(.seconds(2)) : .done
            }
            #expect(try dead.requeue() == 1)
            #expect(eventually { requeuedCalls.count >= 1 })
            usleep(500_000)
            #expect(requeuedCalls.count == 1, "put off, not offered again at once: \(requeuedCalls.values)")
            #expect(eventually { requeuedCalls.count == 2 })
            usleep(200_000)
            #expect(requeuedCalls.values == [1, 1], "handled once more, no attempt counted")
            strict.cancel()
        }
    }

    @Test(
        "Attempts and set-aside messages survive a restart of the consumer",
        arguments: EngineKind.underTest
    )
    func restart(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let policy = QueueRetryPolicy(maximumAttempts: 4, firstDelay: .milliseconds(400), jitter: 0)
            let attempts = Collector<Int>()
            var consumer: QueueConsumer? = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: policy,
                errorHandler: { _ in }
            ) { message in
                attempts.append(message.attempt)
                throw ContractFailure()
            }
            try producer.enqueue(1)
            #expect(eventually { attempts.count == 1 })
            consumer?.cancel()
            consumer = nil

            let handled = Collector<String>()
            let restarted = try fixture.wormhole("worker-again").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: policy,
                errorHandler: { _ in }
            ) { message in
                handled.append("\(message.value)#\(message.attempt)")
            }
            #expect(eventually { handled.count == 1 })
            #expect(handled.values == ["1#2"], "its second attempt, after the first one's back-off")
            usleep(150_000)
            #expect(handled.count == 1)
            restarted.cancel()
        }
    }

    @Test(
        "A message that cannot be decoded goes to the dead letters at once; a failed batch's messages come back",
        arguments: EngineKind.underTest
    )
    func undecodableAndBatches(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            try producer.enqueue(1)
            try producer.enqueueData(Data("not a number".utf8))
            try producer.enqueue(contentsOf: [3, 4])
            let batches = Collector<[String]>()
            let failedOnce = Locked(false)
            let consumer = try fixture.wormhole("worker").queue("jobs").consumeBatches(
                consumer: "worker",
                as: Int.self,
                retry: Self.quick,
                errorHandler: { _ in }
            ) { messages in
                batches.append(messages.map { "\($0.value)#\($0.attempt)" })
                if !failedOnce.withLock({ $0 }) {
                    failedOnce.withLock { $0 = true }
                    throw ContractFailure()
                }
            }
            #expect(eventually { batches.values.flatMap { $0 }.filter { $0.hasSuffix("#2") }.count == 3 })
            let all = batches.values.flatMap { $0 }
            #expect(all.filter { $0.hasSuffix("#1") }.sorted() == ["1#1", "3#1", "4#1"])
            #expect(all.filter { $0.hasSuffix("#2") }.sorted() == ["1#2", "3#2", "4#2"])
            let letters = try producer.deadLetters(consumer: "worker").list()
            #expect(letters.map(\.reason) == [.undecodable])
            #expect(letters.first.map { String(decoding: $0.payload, as: UTF8.self) } == "not a number")
            #expect(try producer.deadLetters(consumer: "worker").drop() == 1)
            #expect(try producer.deadLetters(consumer: "worker").count == 0)
            consumer.cancel()
        }
    }
}
