import Foundation
import Testing
import WormholeKit
import WormholeTesting

/// An in-memory engine whose queue cursors fail their next `failures` acknowledgements, as a PostgreSQL connection
/// that drops (or a deadlock) fails one: the acknowledgement may not have been stored.
final class FailingAcknowledgementEngine: WormholeEngine {
    let base = InMemoryEngine()
    let failures: Locked<Int>
    init(failures: Int) { self.failures = Locked(failures) }

    var description: String { "in-memory, failing acknowledgements" }
    var transiting: any Transiting { base.transiting }
    var notifier: any Notifier { base.notifier }
    func queueLog(_ identifier: String, sender: String, retention: Duration) throws(WormholeError) -> any QueueLog {
        FailingLog(base: try base.queueLog(identifier, sender: sender, retention: retention), failures: failures)
    }
    func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore { try base.suiteStore(name) }
    func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
        try base.liveTransport(sender: sender)
    }
    func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
        try base.transferStaging(identifier)
    }

    final class FailingLog: QueueLog {
        let base: any QueueLog
        let failures: Locked<Int>
        init(base: any QueueLog, failures: Locked<Int>) {
            self.base = base
            self.failures = failures
        }
        var identifier: String { base.identifier }
        func append(contentsOf payloads: some Sequence<Data>) throws(WormholeError) {
            try base.append(contentsOf: payloads)
        }
        func openCursor(consumer: String) throws(WormholeError) -> any QueueCursor {
            FailingCursor(base: try base.openCursor(consumer: consumer), failures: failures)
        }
        func status() throws(WormholeError) -> QueueStatus { try base.status() }
        func reclaimSpace() throws(WormholeError) { try base.reclaimSpace() }
    }

    final class FailingCursor: QueueCursor {
        let base: any QueueCursor
        let failures: Locked<Int>
        init(base: any QueueCursor, failures: Locked<Int>) {
            self.base = base
            self.failures = failures
        }
        var consumer: String { base.consumer }
        var position: UInt64 { base.position }
        func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
            try base.read(maximumCount: maximumCount)
        }
        func acknowledge(through end: UInt64) throws(WormholeError) {
            let fails = failures.withLock { (left) -> Bool in
                defer { left -= 1 }
                return left > 0
            }
            if fails {
                throw WormholeError(.serverUnavailable, "the connection dropped during the acknowledgement")
            }
            try base.acknowledge(through: end)
        }
        func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
            try base.observeAppends(handler)
        }
    }
}

@Suite("A failed acknowledgement is retried, not redelivered", .limit(minutes: 3))
struct OwedAcknowledgementTests {
    /// A queue whose consumer `worker` fails its first `failures` acknowledgements, and what it handled and reported.
    struct Fixture {
        let queue: WormholeQueue
        let consumer: QueueConsumer
        let handled = Collector<Int>()
        let errors = Collector<WormholeError>()

        init(failures: Int) throws {
            let wormhole = Wormhole(engine: FailingAcknowledgementEngine(failures: failures), sender: "test")
            queue = try wormhole.queue("jobs")
            let (handled, errors) = (handled, errors)
            consumer = try queue.consume(consumer: "worker", as: Int.self, errorHandler: { errors.append($0) }) {
                handled.append($0.value)
            }
        }
    }

    @Test("Three failed acknowledgements: every message handled once, in order, and the position stored")
    func retried() async throws {
        try await offThePool {
            let fixture = try Fixture(failures: 3)
            for number in 1...5 { try fixture.queue.enqueue(number) }
            #expect(
                eventually {
                    fixture.handled.count == 5 && fixture.consumer.position == (try? fixture.queue.status().endOffset)
                }
            )
            usleep(300_000)
            #expect(fixture.handled.values == [1, 2, 3, 4, 5], "a handled message is never handed over again")
            #expect(fixture.errors.count == 3, "each failure is reported")
            #expect(fixture.errors.values.allSatisfy { $0.code == .serverUnavailable })
            fixture.consumer.cancel()
        }
    }

    @Test("A consumer cancelled with an acknowledgement owed stores it on the way out")
    func storedAtCancel() async throws {
        try await offThePool {
            let fixture = try Fixture(failures: 1)
            try fixture.queue.enqueue(1)
            // Cancelled as soon as the acknowledgement failed, before its retry (50 ms later) is due: the cancel
            // stores it (or the retry did, if it came first).
            #expect(eventually(timeout: 10) { fixture.errors.count == 1 })
            fixture.consumer.cancel()
            let again = Collector<Int>()
            let next = try fixture.queue.consume(consumer: "worker", as: Int.self) { again.append($0.value) }
            usleep(300_000)
            #expect(again.values.isEmpty, "the handled message is not handed to the consumer's next run")
            #expect(fixture.handled.values == [1])
            next.cancel()
        }
    }
}
