import Foundation
import Testing
import WormholeKit

/// The contract of scheduled queue messages, for every engine (``QueueSchedule``).
///
/// A message enqueued with a schedule is offered to each consumer once, no earlier than its time, across restarts
/// of the consumer; one whose time to live ran out before a consumer came to it is that consumer's dead letter with
/// the reason ``QueueDeadLetter/Reason/expired``, never handed to its handler.
@Suite("Contract: scheduled queue messages", .limit(minutes: 3))
struct QueueScheduleContract {
    @Test(
        "A delayed message is offered to each consumer once, never before its time; others flow meanwhile",
        arguments: EngineKind.underTest
    )
    func delayed(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let handled = [Collector<String>(), Collector<String>()]
            let times = Collector<Date>()
            let consumers = try (0..<2).map { index in
                try fixture.wormhole("worker-\(index)").queue("jobs").consume(consumer: "c\(index)", as: Int.self) {
                    message in
                    if message.value == 1 { times.append(Date()) }
                    handled[index].append("\(message.value)")
                }
            }
            let notBefore = Date().addingTimeInterval(4)
            try producer.enqueue(1, schedule: .at(notBefore))
            try producer.enqueue(2)
            #expect(eventually { handled.allSatisfy { $0.values == ["2"] } }, "the unscheduled one flows at once")
            #expect(eventually { (try? producer.status().consumers.map(\.scheduled)) == [1, 1] })
            #expect(eventually(timeout: 20) { handled.allSatisfy { $0.count == 2 } })
            #expect(handled.map(\.values) == [["2", "1"], ["2", "1"]])
            #expect(times.values.allSatisfy { $0 >= notBefore }, "never before its time")
            usleep(200_000)
            #expect(handled.map(\.count) == [2, 2], "once each")
            #expect(try producer.status().consumers.map(\.scheduled) == [0, 0])
            for consumer in consumers { consumer.cancel() }
        }
    }

    @Test("A delayed message waits across a restart of its consumer", arguments: EngineKind.underTest)
    func acrossRestart(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            let early = Collector<Int>()
            var first: QueueConsumer? = try fixture.wormhole("worker").queue("jobs").consume(
                consumer: "worker",
                as: Int.self
            ) { early.append($0.value) }
            let notBefore = Date().addingTimeInterval(4)
            try producer.enqueue(7, schedule: .at(notBefore))
            // Taken into the consumer's retries, not only in the scheduled log.
            let retries = try fixture.wormhole("audit").engine.suiteStore("jobs#retries#worker")
            #expect(eventually { (try? retries.read().values.keys.count) == 1 })
            first?.cancel()
            first = nil
            #expect(early.count == 0)

            let handled = Collector<Date>()
            let second = try fixture.wormhole("worker-again").queue("jobs").consume(consumer: "worker", as: Int.self) {
                _ in handled.append(Date())
            }
            #expect(eventually(timeout: 20) { handled.count == 1 })
            #expect(handled.values.allSatisfy { $0 >= notBefore })
            usleep(200_000)
            #expect(handled.count == 1)
            second.cancel()
        }
    }

    @Test(
        "A message whose time to live ran out is a dead letter ('expired'), never handled; requeued, it is",
        arguments: EngineKind.underTest
    )
    func expired(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let producer = try fixture.wormhole("app").queue("jobs")
            // Registered first, so that the message is the consumer's to handle; stopped while it expires.
            let registering = try fixture.wormhole("worker").queue("jobs").consume(consumer: "worker", as: Int.self) {
                _ in
            }
            registering.cancel()
            try producer.enqueue(5, schedule: .expiring(after: .milliseconds(200)))
            try producer.enqueue(6, schedule: .expiring(after: .seconds(600)))
            usleep(400_000)
            let handled = Collector<Int>()
            let consumer = try fixture.wormhole("worker").queue("jobs").consume(consumer: "worker", as: Int.self) {
                handled.append($0.value)
            }
            let dead = try producer.deadLetters(consumer: "worker")
            #expect(eventually { (try? dead.count) == 1 && handled.count == 1 })
            #expect(handled.values == [6], "the one still alive is handled")
            let letter = try #require(try dead.list().first)
            #expect(letter.reason == .expired)
            #expect(letter.isScheduled)
            #expect(letter.attempts == 0)
            #expect(try JSONDecoder().decode(Int.self, from: letter.payload) == 5)
            #expect(try dead.requeue() == 1)
            #expect(eventually { handled.count == 2 })
            #expect(handled.values == [6, 5], "requeued, it no longer expires")
            #expect(try dead.count == 0)
            consumer.cancel()
        }
    }
}
