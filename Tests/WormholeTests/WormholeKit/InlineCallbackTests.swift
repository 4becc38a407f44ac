import Foundation
import Synchronization
import Testing

@testable import WormholeKit

/// The default callback execution, `.automatic`: inline on the inotify thread, a blocked callback taken over.
@Suite("Callbacks run inline by default, and one that blocks is taken over", .limit(minutes: 3))
struct InlineCallbackTests {
    let directory = TemporaryDirectory()

    @Test("By default callbacks run on the inotify thread, in order; the current message not on the caller's")
    func inlineOnTheNotifierThread() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            try wormhole.passMessageObject(0, identifier: "count")
            let caller = currentThreadID()
            let received = Collector<(Int, String, Bool)>()
            let listener = try wormhole.listenForMessage(
                withIdentifier: "count",
                as: Int.self,
                deliveringCurrentMessage: true
            ) { number in
                received.append((number, currentThreadName(), currentThreadID() == caller))
            }
            #expect(eventually { received.count == 1 })
            for number in 1...50 {
                try wormhole.passMessageObject(number, identifier: "count")
                #expect(eventually { received.values.last?.0 == number })
            }
            let values = received.values
            #expect(values.map(\.0) == Array(0...50), "each once, in order")
            #expect(values.allSatisfy { !$0.2 }, "never on the thread that started listening")
            // The first runs on the listener's queue, and the second may find that queue still at work; and a callback
            // held up past the watchdog's limit by a busy machine moves the listener to its queue for good: so most,
            // not every one, is asserted to have run on the inotify thread.
            #expect(values.filter { $0.1 == "wh-inotify" }.count >= 25, "threads: \(Set(values.map(\.1)))")
            _ = listener
        }
    }

    @Test("A default callback that blocks does not stop other listeners, and moves to its own queue")
    func blockedCallbackIsTakenOver() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let released = DispatchSemaphore(value: 0)
            let blocked = Collector<(Int, String, Bool)>()
            let others = Collector<(String, String)>()
            // The first message's callback waits for another listener's callback: with every callback waiting on one
            // thread, they would never meet.
            let waiting = try wormhole.listenForMessage(withIdentifier: "slow", as: Int.self) { number in
                let met = number == 1 ? released.wait(timeout: .now() + 20) == .success : true
                blocked.append((number, currentThreadName(), met))
            }
            let releasing = try wormhole.listenForMessage(withIdentifier: "fast", as: String.self) { text in
                others.append((text, currentThreadName()))
                if text == "release" { released.signal() }
            }
            let queue = try wormhole.queue("jobs")
            let consumer = try queue.consume(consumer: "worker", as: String.self) { message in
                others.append(("job " + message.value, currentThreadName()))
            }
            // Quiet for longer than the watchdog stays awake, so that the blocking callback has to wake it.
            Thread.sleep(forTimeInterval: 1.3)
            try wormhole.passMessageObject(1, identifier: "slow")
            try wormhole.passMessageObject("release", identifier: "fast")
            #expect(eventually { blocked.count == 1 })
            #expect(blocked.values.first?.1 == "wh-inotify", "it blocked the inotify thread")
            #expect(blocked.values.first?.2 == true, "the other listener's callback ran while this one waited")
            try queue.enqueue("after")
            try wormhole.passMessageObject("later", identifier: "fast")
            try wormhole.passMessageObject(2, identifier: "slow")
            #expect(eventually { blocked.count == 2 && others.count == 3 })
            #expect(Set(others.values.map(\.0)) == ["release", "job after", "later"])
            #expect(others.values.contains { $0.1 == "wh-inotify" }, "quick callbacks stay inline: \(others.values)")
            #expect(blocked.values.last?.0 == 2)
            #expect(blocked.values.last?.1 != "wh-inotify", "the listener that blocked moved to its own queue")
            _ = (waiting, releasing, consumer)
        }
    }

    @Test("By default a live listener's callbacks run on its endpoint's thread, in order, each once")
    func liveCallbacksInline() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let received = Collector<(Int, String)>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "tick", as: Int.self) { number in
                received.append((number, currentThreadName()))
            }
            for number in 0..<50 {
                try wormhole.sendMessage(number, identifier: "tick")
                #expect(eventually { received.values.last?.0 == number })
            }
            let values = received.values
            #expect(values.map(\.0) == Array(0..<50), "each once, in order")
            // A callback held up past the watchdog's limit by a busy machine moves the listener to its queue for
            // good, so that only some, not every one, is asserted to have run inline (with a serial queue, none
            // would).
            #expect(values.contains { $0.1 == "wh-live" }, "threads: \(Set(values.map(\.1)))")
            _ = listener
        }
    }

    @Test("A live listener whose quick callbacks pile up hands the backlog to its queue: senders are not held up")
    func liveBacklogGoesToTheQueue() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let received = Collector<Int>()
            // Each callback takes 5 ms, under the watchdog's limit: 2,000 of them take 10 s, while the socket's
            // buffer holds a few hundred messages. A sender held up by the listener would end only once all but
            // those had been handled; one that is not ends long before, unless the machine makes 2,000 sends take
            // more than 7.5 s.
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "tick", as: Int.self) { number in
                usleep(5000)
                received.append(number)
            }
            let count = 2000
            for number in 0..<count { try wormhole.sendMessage(number, identifier: "tick") }
            #expect(received.count < count - 500, "the sends did not wait for the callbacks")
            #expect(eventually(timeout: 60) { received.count == count })
            #expect(received.values == Array(0..<count), "each once, in order")
            _ = listener
        }
    }

    @Test("A live callback that blocks has its endpoint's reading taken over: senders go on, nothing lost or reordered")
    func blockedLiveCallbackIsTakenOver() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let released = DispatchSemaphore(value: 0)
            let received = Collector<(Int, String)>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "tick", as: Int.self) { number in
                // The first callback waits until every message was sent: far more than the socket's buffer holds,
                // so the sends end only if another thread reads the socket meanwhile.
                if number == 0 { _ = released.wait(timeout: .now() + 60) }
                received.append((number, currentThreadName()))
            }
            let count = 5000
            let sent = Locked(0)
            let failure = Locked<WormholeError?>(nil)
            Thread {
                for number in 0..<count {
                    do throws(WormholeError) {
                        try wormhole.sendMessage(number, identifier: "tick")
                        sent.withLock { $0 += 1 }
                    } catch {
                        failure.withLock { $0 = error }
                        return
                    }
                }
            }.start()
            #expect(eventually(timeout: 60) { sent.withLock { $0 } == count || failure.withLock { $0 } != nil })
            #expect(failure.withLock { $0 } == nil)
            #expect(received.count == 0, "the first callback still blocks")
            released.signal()
            #expect(eventually(timeout: 60) { received.count == count })
            let values = received.values
            #expect(values.map(\.0) == Array(0..<count), "each once, in order")
            #expect(values.first?.1 == "wh-live", "it blocked the endpoint's thread")
            _ = listener
        }
    }

    @Test("A DriverThread runs default callbacks inline; one that blocks has its work taken over, and stop ends it")
    func driverThreadTakeover() async throws {
        try await offThePool {
            let thread = DriverThread(name: "wh-test-driver")
            let blocking = CallbackExecution.automatic.makeScheduler(label: "blocking")
            let quick = CallbackExecution.automatic.makeScheduler(label: "quick")
            let released = DispatchSemaphore(value: 0)
            let ran = Collector<(String, String)>()
            thread.submit {
                blocking {
                    ran.append(("blocking", currentThreadName()))
                    _ = released.wait(timeout: .now() + 30)
                }
                quick { ran.append(("quick 1", currentThreadName())) }
            }
            // The quick listener's callback, scheduled behind the blocked one on the same thread, runs only once a
            // new thread has taken that thread's work over.
            #expect(eventually(timeout: 10) { ran.count == 2 }, "taken over while the first still blocks")
            thread.submit { quick { ran.append(("quick 2", currentThreadName())) } }
            #expect(eventually(timeout: 10) { ran.count == 3 }, "work submitted after the takeover runs")
            #expect(ran.values.map(\.0) == ["blocking", "quick 1", "quick 2"])
            #expect(ran.values.allSatisfy { $0.1 == "wh-test-driver" }, "\(ran.values)")
            released.signal()
            thread.stop()
            thread.submit { quick { ran.append(("after stop", currentThreadName())) } }
            Thread.sleep(forTimeInterval: 0.2)
            #expect(ran.count == 3, "nothing runs once stopped")
        }
    }

    @Test("A DriverThread told to finish runs the work submitted before, and none after")
    func driverThreadFinish() async throws {
        try await offThePool {
            let thread = DriverThread(name: "wh-test-finish")
            let released = DispatchSemaphore(value: 0)
            let ran = Collector<String>()
            // Work itself is not timed (only callbacks are): this one holds the thread until released.
            thread.submit {
                _ = released.wait(timeout: .now() + 30)
                ran.append("first")
            }
            thread.submit { ran.append("before finish") }
            thread.finish()
            thread.submit { ran.append("after finish") }
            released.signal()
            #expect(eventually(timeout: 10) { ran.count == 2 })
            Thread.sleep(forTimeInterval: 0.2)
            #expect(ran.values == ["first", "before finish"])
        }
    }

    @Test("A task that prefers NotifierTaskExecutor resumes on the inotify thread as it iterates")
    func taskExecutorResumesInline() async throws {
        let wormhole = try Wormhole(directory: directory("w"))
        let messages = wormhole.messages(withIdentifier: "count", as: Int.self)
        let seen = Collector<(Int, String)>()
        let plainSeen = Collector<(Int, String)>()
        let reader = Task(executorPreference: NotifierTaskExecutor()) {
            for try await number in messages {
                seen.append((number, currentThreadName()))
                if number == 20 { break }
            }
        }
        let plain = Task {
            for try await number in wormhole.messages(withIdentifier: "count", as: Int.self) {
                plainSeen.append((number, currentThreadName()))
                if number == 20 { break }
            }
        }
        try await offThePool {
            // Each message once both readers have the one before: a mailbox keeps the newest.
            for number in 1...20 {
                try wormhole.passMessageObject(number, identifier: "count")
                #expect(eventually { seen.values.last?.0 == number && plainSeen.values.last?.0 == number })
            }
        }
        try await reader.value
        try await plain.value
        #expect(seen.values.map(\.0) == Array(1...20))
        // (A callback held up past the watchdog's limit, by a busy machine, moves to the executor's queue: most, not
        // every one, is asserted to have run on the notifier's thread.)
        let inline = seen.values.filter { $0.1 == "wh-inotify" }.count
        #expect(inline >= 10, "threads: \(Set(seen.values.map(\.1)))")
        #expect(!plainSeen.values.contains { $0.1 == "wh-inotify" }, "a plain task runs on the global executor")
    }

    @Test("Under load, with callbacks that block now and then, every listener gets its messages once, in order")
    func takeoversUnderLoad() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let identifiers = (0..<4).map { "m\($0)" }
            let count = 200
            // Two listeners per mailbox; the first of m0 and of m1 blocks for 30 ms on every 40th message, which has
            // the notifier's work taken over (and that listener moved to its queue) while the others go on.
            let received = (0..<8).map { _ in Collector<Int>() }
            var listeners: [MessageListener] = []
            for (index, collector) in received.enumerated() {
                let blocks = index == 0 || index == 2
                listeners.append(
                    try wormhole.listenForMessage(withIdentifier: identifiers[index / 2], as: Int.self) { number in
                        if blocks && number % 40 == 0 { usleep(30_000) }
                        collector.append(number)
                    }
                )
            }
            // A queue consumer on the same thread whose handler blocks once: every message still comes once, in order.
            let queue = try wormhole.queue("jobs")
            let jobs = Collector<Int>()
            let consumer = try queue.consume(consumer: "worker", as: Int.self) { message in
                if message.value == 50 { usleep(40_000) }
                jobs.append(message.value)
            }
            for number in 1...count {
                for identifier in identifiers { try wormhole.passMessageObject(number, identifier: identifier) }
                try queue.enqueue(number)
                if number % 25 == 0 { usleep(2_000) }
            }
            #expect(eventually(timeout: 30) { received.allSatisfy { $0.values.last == count } && jobs.count == count })
            for (index, collector) in received.enumerated() {
                let values = collector.values
                #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 }, "listener \(index): \(values)")
            }
            #expect(jobs.values == Array(1...count))
            _ = (listeners, consumer)
        }
    }

    @Test("A consumer catching up on a long backlog on the inotify thread does so in passes, and is not moved off it")
    func backlogInPasses() async throws {
        try await offThePool {
            let wormhole = try Wormhole(directory: directory("w"))
            let queue = try wormhole.queue("backlog")
            let count = 30_000
            let handled = Collector<(Int, String)>()
            let consumer = try queue.consume(consumer: "worker", as: Int.self) { message in
                if message.value % 1_000 == 0 || message.value > count {
                    handled.append((message.value, currentThreadName()))
                }
            }
            // On the notifier thread proper, a pass is not timed and never stops early.
            let onNotifier = Collector<Int>()
            let direct = try queue.consume(consumer: "direct", as: Int.self, on: .notifierThread) { message in
                if message.value % 1_000 == 0 { onNotifier.append(message.value) }
            }
            // One append, one wake-up: one pass would take far longer than the watchdog's 20 ms.
            try queue.enqueue(contentsOf: Array(1...count))
            #expect(eventually(timeout: 60) { handled.values.last?.0 == count })
            #expect(handled.values.map(\.0) == Array(stride(from: 1_000, through: count, by: 1_000)))
            #expect(eventually { onNotifier.count == count / 1_000 })
            #expect(onNotifier.values == Array(stride(from: 1_000, through: count, by: 1_000)))
            // A consumer taken for blocking would handle the next message on its own queue (a thread taken over is
            // named as its successor is, so only the next message tells).
            try queue.enqueue(count + 1)
            #expect(eventually { handled.values.last?.0 == count + 1 })
            // A busy machine (the suite's other tests, in parallel) can hold one 5 ms pass past the watchdog's 20 ms
            // and move the consumer anyway: then this is recorded as a known, intermittent issue, not a failure.
            withKnownIssue("a pass held past 20 ms by a busy machine", isIntermittent: true) {
                #expect(handled.values.last?.1 == "wh-inotify", "moved off: \(handled.values.last!)")
            }
            _ = (consumer, direct)
        }
    }
}
