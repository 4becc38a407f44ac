import Foundation
import Testing
import WormholeKit
import WormholeTesting

/// A consumer's retries when its engine's suites fail to write: a message handled is never handled again, and the
/// consumer neither stops nor spins.
@Suite("Queue retries: suite writes that fail", .limit(minutes: 2))
struct QueueRetryFaultTests {
    /// An `InMemoryEngine` whose suite updates throw `ioFailure` while ``failing`` is set.
    final class FlakyEngine: WormholeEngine {
        let base = InMemoryEngine()
        let failing = Locked(false)
        /// Run after each suite update that succeeded, with the suite's name.
        let afterUpdate = Locked<(@Sendable (String) -> Void)?>(nil)
        var description: String { "flaky in-memory" }
        var transiting: any Transiting { base.transiting }
        var notifier: any Notifier { base.notifier }

        func queueLog(_ identifier: String, sender: String, retention: Duration) throws(WormholeError) -> any QueueLog {
            try base.queueLog(identifier, sender: sender, retention: retention)
        }

        func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore {
            FlakySuiteStore(base: try base.suiteStore(name), failing: failing, afterUpdate: afterUpdate)
        }

        func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
            try base.liveTransport(sender: sender)
        }

        func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
            try base.transferStaging(identifier)
        }
    }

    struct FlakySuiteStore: SuiteStore {
        let base: any SuiteStore
        let failing: Locked<Bool>
        let afterUpdate: Locked<(@Sendable (String) -> Void)?>
        var name: String { base.name }

        func read() throws(WormholeError) -> SuiteState { try base.read() }

        func update(
            sender: String,
            direction: String?,
            _ body: (inout SuiteValues) throws(WormholeError) -> Void
        ) throws(WormholeError) -> SuiteChange? {
            if failing.withLock({ $0 }) { throw WormholeError(.ioFailure, "the test's suite refuses writes") }
            let change = try base.update(sender: sender, direction: direction, body)
            afterUpdate.withLock { $0 }?(base.name)
            return change
        }

        func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
            try base.changes(after: version)
        }

        func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
            try base.observe(handler)
        }
    }

    @Test("A retried message handled while its entry cannot be removed is not handled again; the entry goes later")
    func resolveFails() async throws {
        try await offThePool {
            let engine = FlakyEngine()
            let queue = try Wormhole(engine: engine).queue("jobs")
            let attempts = Collector<Int>()
            let errors = Collector<WormholeError.Code>()
            let consumer = try queue.consume(
                consumer: "worker",
                as: Int.self,
                retry: QueueRetryPolicy(maximumAttempts: 5, firstDelay: .milliseconds(50), jitter: 0),
                errorHandler: { errors.append($0.code) }
            ) { message in
                attempts.append(message.attempt)
                guard message.value == 1 else { return }
                if message.attempt == 1 { throw ContractFailure() }
                // The second attempt succeeds, and the removal of its entry fails.
                engine.failing.withLock { $0 = true }
            }
            try queue.enqueue(1)
            #expect(eventually { attempts.count == 2 && errors.values.contains(.ioFailure) })
            usleep(400_000)
            #expect(attempts.values == [1, 2], "handled once, however the write went")
            // Writes work again: the next pass removes the entry.
            engine.failing.withLock { $0 = false }
            try queue.enqueue(2)
            #expect(eventually { attempts.count == 3 })
            #expect(eventually { (try? queue.status().consumers.first?.waitingForRetry) == 0 })
            #expect(attempts.values == [1, 2, 1])
            consumer.cancel()
        }
    }

    @Test("A failure that cannot be set aside is offered again in a second, not at once and not never")
    func setAsideFails() async throws {
        try await offThePool {
            let engine = FlakyEngine()
            let queue = try Wormhole(engine: engine).queue("jobs")
            let times = Collector<ContinuousClock.Instant>()
            engine.failing.withLock { $0 = true }
            // Enqueued first, so that nothing but the consumer's start and its timers wakes it.
            try queue.enqueue(1)
            let consumer = try queue.consume(
                consumer: "worker",
                as: Int.self,
                retry: QueueRetryPolicy(maximumAttempts: 5, firstDelay: .milliseconds(50), jitter: 0),
                errorHandler: { _ in }
            ) { message in
                times.append(.now)
                if times.count >= 3 { engine.failing.withLock { $0 = false } }
                if times.count < 4 { throw ContractFailure() }
            }
            #expect(eventually(timeout: 20) { times.count == 4 })
            let gaps = zip(times.values.dropFirst(), times.values).map { $0 - $1 }
            #expect(gaps.prefix(2).allSatisfy { $0 >= .milliseconds(900) }, "a second apart: \(gaps)")
            usleep(300_000)
            #expect(times.count == 4)
            #expect(try queue.status().consumers.first?.lagMessages == 0)
            #expect(try queue.status().consumers.first?.waitingForRetry == 0)
            consumer.cancel()
        }
    }

    @Test("A dead letter requeued between the consumer's two writes is offered again, not lost")
    func requeueBetweenTheTwoWrites() async throws {
        try await offThePool {
            let engine = FlakyEngine()
            let queue = try Wormhole(engine: engine).queue("jobs")
            // The requeue goes through the engine itself, not the hooked one: another process's.
            let other = try Wormhole(engine: engine.base).queue("jobs").deadLetters(consumer: "worker")
            let requeued = Locked(false)
            engine.afterUpdate.withLock {
                $0 = { name in
                    guard name.contains("#dead-letters#"), !requeued.withLock({ $0 }) else { return }
                    requeued.withLock { $0 = true }
                    // Right after the dead letter is written, before the consumer removes its retries entry.
                    _ = try? other.requeue()
                }
            }
            let attempts = Collector<Int>()
            let keptWhileHandled = Collector<Int?>()
            let consumer = try queue.consume(
                consumer: "worker",
                as: Int.self,
                retry: QueueRetryPolicy(maximumAttempts: 2, firstDelay: .milliseconds(20), jitter: 0),
                errorHandler: { _ in }
            ) { message in
                attempts.append(message.attempt)
                // Fails until it was requeued once.
                if !requeued.withLock({ $0 }) { throw ContractFailure() }
                // The requeued entry is in the suite while it is handled: a restart now would find it.
                keptWhileHandled.append(try queue.status().consumers.first?.waitingForRetry)
            }
            try queue.enqueue(1)
            #expect(eventually { attempts.count == 3 })
            #expect(attempts.values == [1, 2, 1], "two attempts, then once more after the requeue")
            #expect(keptWhileHandled.values == [1], "the requeue was kept, not removed by the consumer's second write")
            #expect(eventually { (try? queue.status().consumers.first?.waitingForRetry) == 0 })
            #expect(try other.count == 0)
            consumer.cancel()
        }
    }

    @Test("A requeue cut off between its two writes is offered by the next consumer, not dropped as a dead letter")
    func requeueCutOff() async throws {
        try await offThePool {
            let engine = FlakyEngine()
            let queue = try Wormhole(engine: engine).queue("jobs")
            let fixed = Locked(false)
            let handled = Collector<Int>()
            let retry = QueueRetryPolicy(maximumAttempts: 1)
            var consumer: QueueConsumer? = try queue.consume(
                consumer: "worker",
                as: Int.self,
                retry: retry,
                errorHandler: { _ in }
            ) { message in
                if !fixed.withLock({ $0 }) { throw ContractFailure() }
                handled.append(message.value)
            }
            try queue.enqueue(1)
            let dead = try queue.deadLetters(consumer: "worker")
            #expect(eventually { (try? dead.count) == 1 })
            consumer?.cancel()
            consumer = nil
            // The requeue writes the retries entry, then its removal of the dead letter fails: both are there.
            let armed = Locked(true)
            engine.afterUpdate.withLock {
                $0 = { name in
                    if name.contains("#retries#"), armed.withLock({ $0 }) {
                        armed.withLock { $0 = false }
                        engine.failing.withLock { $0 = true }
                    }
                }
            }
            #expect(throws: WormholeError.self) { try dead.requeue() }
            engine.failing.withLock { $0 = false }
            #expect(try dead.count == 1)
            fixed.withLock { $0 = true }
            let again = try queue.consume(consumer: "worker", as: Int.self, retry: retry, errorHandler: { _ in }) {
                message in handled.append(message.value)
            }
            #expect(eventually { handled.values == [1] }, "the requeue is offered")
            usleep(200_000)
            #expect(handled.values == [1], "once")
            again.cancel()
        }
    }
}
