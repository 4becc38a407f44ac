import Foundation
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// Retries, dead letters and scheduled messages on PostgreSQL when the server restarts: what waits for its time is
/// kept in the server, and is offered once, at its time, by a consumer started again after the restart.
@Suite(
    "PostgreSQL: queue retries and scheduled messages across a server restart",
    .slow("needs a PostgreSQL server of its own"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 3)
)
struct PostgresQueueRetryTests {
    @Test("A delayed message and a message waiting for its retry survive a restart of the server and of their consumer")
    func serverRestart() async throws {
        try await offThePool {
            let server = try LocalPostgresServer(durable: true)
            defer { server.close() }
            let group = uniqueGroup("retry-restart")
            let policy = QueueRetryPolicy(maximumAttempts: 3, firstDelay: .seconds(6), jitter: 0)
            let producerEngine = try PostgresEngine(url: server.url, group: group)
            defer { producerEngine.close() }
            let producer = try Wormhole(engine: producerEngine, sender: "app").queue("jobs")
            let attempts = Collector<String>()
            let firstAttempt = Locked<Date?>(nil)
            let dueBox = Locked<Date?>(nil)
            do {
                let engine = try PostgresEngine(url: server.url, group: group)
                defer { engine.close() }
                let consumer = try Wormhole(engine: engine, sender: "worker").queue("jobs").consume(
                    consumer: "worker",
                    as: Int.self,
                    retry: policy,
                    errorHandler: { _ in }
                ) { message in
                    attempts.append("\(message.value)#\(message.attempt)")
                    firstAttempt.withLock { $0 = $0 ?? Date() }
                    throw ContractFailure()
                }
                try producer.enqueue(1)
                #expect(eventually { attempts.values == ["1#1"] })
                // Due after the restart, as the retry is (6 s after the first attempt).
                let due = Date().addingTimeInterval(6)
                dueBox.withLock { $0 = due }
                try producer.enqueue(2, schedule: .at(due))
                #expect(
                    eventually {
                        let status = try? producer.status().consumers.first
                        return status?.waitingForRetry == 1 && status?.scheduled == 1
                    }
                )
                consumer.cancel()
            }
            try server.restart()

            // A new consumer, after the restart: the retry comes at its time, the delayed message at its time.
            let handled = Collector<String>()
            let times = Locked<[String: Date]>([:])
            let engine = try PostgresEngine(url: server.url, group: group)
            defer { engine.close() }
            let consumer = try Wormhole(engine: engine, sender: "worker-again").queue("jobs").consume(
                consumer: "worker",
                as: Int.self,
                retry: policy,
                errorHandler: { _ in }
            ) { message in
                handled.append("\(message.value)#\(message.attempt)")
                times.withLock { $0["\(message.value)"] = Date() }
            }
            #expect(eventually(timeout: 30) { handled.count == 2 })
            #expect(Set(handled.values) == ["1#2", "2#1"], "\(handled.values)")
            let retryDue = try #require(firstAttempt.withLock { $0 }).addingTimeInterval(6)
            let due = try #require(dueBox.withLock { $0 })
            #expect(
                times.withLock { $0["1"] }.map { $0 >= retryDue.addingTimeInterval(-0.05) } == true,
                "at its back-off"
            )
            #expect(times.withLock { $0["2"] }.map { $0 >= due } == true, "never before its time")
            usleep(500_000)
            #expect(handled.count == 2, "once each")
            let status = try producer.status().consumers.first
            #expect(status?.waitingForRetry == 0 && status?.scheduled == 0 && status?.lagMessages == 0)
            consumer.cancel()
        }
    }
}
