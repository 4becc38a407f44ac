import CWormholeSystem
import Foundation
import Synchronization

// The default callback execution, `CallbackExecution.automatic`: a listener's callbacks run one at a time and in
// order, on the notifier's own thread when they are scheduled there (no hand-off to another thread, which on a busy
// CPU costs a context switch per message), and on a serial dispatch queue of the listener's own otherwise. A callback
// that blocks the notifier's thread for longer than `CallbackDriver.blockedAfter` has the thread's work taken over by
// a new thread (the way Go hands off a blocked thread's work), and its listener moves to its dispatch queue for good.

/// A first-in, first-out list that keeps its storage once emptied: on the path of every message, a push and a pop
/// allocate nothing.
struct ReusableQueue<Element> {
    private var elements: [Element] = []
    private var head = 0

    mutating func append(_ element: Element) { elements.append(element) }

    var isEmpty: Bool { head == elements.count }

    /// The oldest element, removed; nil when none is left.
    mutating func popFirst() -> Element? {
        guard head < elements.count else { return nil }
        defer {
            head += 1
            if head == elements.count {
                elements.removeAll(keepingCapacity: true)
                head = 0
            }
        }
        return elements[head]
    }

    /// Every element left, oldest first, removed.
    mutating func removeAll() -> [Element] {
        defer {
            elements = []
            head = 0
        }
        return Array(elements[head...])
    }
}

/// Runs one listener's callbacks in order, one at a time: inline on a callback driver's thread when scheduled from
/// one, on its own serial dispatch queue otherwise.
final class InlineScheduler: Sendable {
    private struct State {
        /// The work scheduled and not yet run.
        var pending = ReusableQueue<@Sendable () -> Void>()
        /// Whether a thread has taken on running the pending work: a driver (after the handler that scheduled it
        /// returns) or the dispatch queue.
        var claimed = false
        /// Set once a callback of this listener blocked a driver: its work goes to the dispatch queue from then on.
        var blocksDrivers = false

        /// The next piece of work; nil, and the claim given up, when none is left.
        mutating func next() -> (@Sendable () -> Void)? {
            guard let work = pending.popFirst() else {
                claimed = false
                return nil
            }
            return work
        }
    }

    private let state = Locked(State())
    private let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    /// Schedules `work` after everything scheduled before it.
    func schedule(_ work: @escaping @Sendable () -> Void) {
        let driver = CallbackDriver.current
        enum Claim { case none, driver, queue }
        let claim = state.withLock { state -> Claim in
            state.pending.append(work)
            guard !state.claimed else { return .none }
            state.claimed = true
            return driver != nil && !state.blocksDrivers ? .driver : .queue
        }
        // Not run here: the caller may hold locks, which a callback must not run under. The driver runs it as soon
        // as the handler that scheduled it returns; a driver already replaced takes nothing more.
        if claim == .none || (claim == .driver && driver!.enqueue(self)) { return }
        queue.async { [self] in runPending(stamping: nil) }
    }

    /// Runs the pending work until none is left; on a driver's thread, each piece is timed by the driver.
    func runPending(stamping driver: CallbackDriver?) {
        let started = driver?.handsBacklogsToQueues == true ? ProcessFacts.coarseMonotonicNanoseconds() : nil
        while let work = state.withLock({ $0.next() }) {
            guard let driver else {
                work()
                continue
            }
            driver.callbackWillStart(self)
            work()
            driver.callbackDidEnd()
            // Still claimed: the queue runs the rest, in order, and later work too until none is left; after that
            // the driver runs this listener's callbacks again.
            if let started, ProcessFacts.coarseMonotonicNanoseconds() &- started >= CallbackDriver.passBudget,
                state.withLock({ !$0.pending.isEmpty })
            {
                queue.async { [self] in runPending(stamping: nil) }
                return
            }
        }
    }

    /// Called when one of this listener's callbacks blocked a driver.
    fileprivate func markBlocking() { state.withLock { $0.blocksDrivers = true } }
}

/// A thread that runs callbacks inline (a notifier's thread) and that can be replaced when one of them blocks.
///
/// The thread installs its driver, calls ``runDeferred()`` after each handler it calls, and stops its loop once
/// ``isReplaced``; ``CallbackWatchdog`` calls `takeOver` with the work not yet started when a callback has run for
/// longer than ``blockedAfter``, and `takeOver` starts a thread that does this one's job.
final class CallbackDriver: Sendable {
    /// How long a callback may hold the driver's thread before its work is taken over: other listeners of the process
    /// wait for a callback that blocks about this long, plus up to a watchdog tick and the coarse clock's step.
    static let blockedAfter: UInt64 = 20_000_000

    private struct State {
        /// The schedulers whose work handlers scheduled, to run once the handler returns.
        var deferred = ReusableQueue<InlineScheduler>()
        /// The listener whose callback runs now, and when it started (the coarse monotonic clock).
        var running: (scheduler: InlineScheduler, started: UInt64)?
        var replaced = false
        /// Whether the watchdog knows this driver: from its first callback on, so that a process whose listeners
        /// all run elsewhere never starts the watchdog's thread.
        var watched = false
    }

    private let state = Locked(State())
    private let takeOver: @Sendable ([InlineScheduler]) -> Void
    /// Whether a listener's backlog of callbacks leaves this driver after ``passBudget``, the rest going to the
    /// listener's queue: for a thread that must go back to reading a socket, whose buffer would otherwise fill and
    /// hold senders up while quick callbacks pile up.
    let handsBacklogsToQueues: Bool

    /// - Parameters:
    ///   - handsBacklogsToQueues: Whether a listener's backlog leaves the driver after ``passBudget``.
    ///   - takeOver: Starts a thread that does this one's job, first running the schedulers given.
    init(handsBacklogsToQueues: Bool = false, takeOver: @escaping @Sendable ([InlineScheduler]) -> Void) {
        self.handsBacklogsToQueues = handsBacklogsToQueues
        self.takeOver = takeOver
    }

    /// The calling thread's driver, if it has one.
    static var current: CallbackDriver? {
        guard let pointer = cwormhole_current_driver() else { return nil }
        return Unmanaged<CallbackDriver>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Makes this the calling thread's driver until ``uninstall()``; the thread keeps a reference to it meanwhile.
    func install() {
        cwormhole_set_current_driver(Unmanaged.passUnretained(self).toOpaque())
    }

    func uninstall() {
        if state.withLock({ $0.watched }) { CallbackWatchdog.shared.unregister(self) }
        cwormhole_set_current_driver(nil)
    }

    /// How long one pass of a queue consumer or a store observer runs on a driver's thread before it leaves the rest
    /// to a pass scheduled after it: each pass is timed on its own, so that catching up on a backlog is never taken
    /// for a callback that blocks.
    static let passBudget: UInt64 = 5_000_000

    /// When a pass that may have to stop early started: nil unless it runs as a timed callback on a driver's thread
    /// (scheduled with ``CallbackExecution/automatic``). Elsewhere a pass never stops early: a `.notifierThread`
    /// pass scheduled again would run at once, inside this one.
    static func passStart() -> UInt64? {
        guard let driver = current, driver.state.withLock({ $0.running != nil }) else { return nil }
        return ProcessFacts.coarseMonotonicNanoseconds()
    }

    /// Whether a pass that started at `start` (from ``passStart()``) has used up ``passBudget``.
    static func passIsOverBudget(_ start: UInt64?) -> Bool {
        guard let start else { return false }
        return ProcessFacts.coarseMonotonicNanoseconds() &- start >= passBudget
    }

    /// Whether another thread has taken over this one's job: its loop must stop.
    var isReplaced: Bool { state.withLock { $0.replaced } }

    /// Takes on running `scheduler`'s pending work at the next ``runDeferred()``; false when this driver was
    /// replaced, and takes nothing more.
    func enqueue(_ scheduler: InlineScheduler) -> Bool {
        state.withLock { state in
            guard !state.replaced else { return false }
            state.deferred.append(scheduler)
            return true
        }
    }

    /// Runs the work that handlers scheduled, in the order they scheduled it; stops early if the driver is replaced
    /// meanwhile (the rest is the new thread's).
    func runDeferred() {
        while let scheduler = state.withLock({ $0.replaced ? nil : $0.deferred.popFirst() }) {
            scheduler.runPending(stamping: self)
        }
    }

    fileprivate func callbackWillStart(_ scheduler: InlineScheduler) {
        let first = state.withLock { state in
            state.running = (scheduler, ProcessFacts.coarseMonotonicNanoseconds())
            defer { state.watched = true }
            return !state.watched
        }
        if first { CallbackWatchdog.shared.register(self) }
        CallbackWatchdog.shared.noteCallback()
    }

    fileprivate func callbackDidEnd() {
        state.withLock { $0.running = nil }
    }

    /// Whether a callback is running on the driver's thread now, and the driver may still be replaced (a replaced
    /// one, still running its blocked listener's callbacks, keeps the watchdog awake no longer).
    fileprivate var isInCallback: Bool { state.withLock { $0.running != nil && !$0.replaced } }

    /// Called by the watchdog: when a callback has held the thread since before `now - blockedAfter`, marks the
    /// driver replaced, moves its listener to its dispatch queue, and hands the work not yet started to a new thread.
    fileprivate func replaceIfBlocked(now: UInt64) {
        let handedOver = state.withLock { state -> (InlineScheduler, [InlineScheduler])? in
            // (A callback may have started after `now` was read.)
            guard !state.replaced, let running = state.running, now > running.started,
                now - running.started >= Self.blockedAfter
            else { return nil }
            state.replaced = true
            return (running.scheduler, state.deferred.removeAll())
        }
        guard let (blocking, rest) = handedOver else { return }
        blocking.markBlocking()
        takeOver(rest)
    }
}

extension CallbackDriver {
    /// Starts a thread named `name` that is a driver: it installs one, runs first the callbacks a blocked thread
    /// handed over (none for the first thread), then `body`, whose loop must end once ``isReplaced``. When a callback
    /// blocks, the watchdog has another such thread take over, with the callbacks not yet started, and run `body`
    /// again: `body` is the thread's whole job, and whatever it owns must outlive the thread it replaced.
    static func startThread(
        named name: String,
        handsBacklogsToQueues: Bool,
        handingOver handedOver: [InlineScheduler]? = nil,
        _ body: @escaping @Sendable (CallbackDriver) -> Void
    ) {
        Thread {
            nameCurrentThread(name)
            let driver = CallbackDriver(handsBacklogsToQueues: handsBacklogsToQueues) { rest in
                startThread(named: name, handsBacklogsToQueues: handsBacklogsToQueues, handingOver: rest, body)
            }
            driver.install()
            defer { driver.uninstall() }
            if let handedOver {
                for scheduler in handedOver { _ = driver.enqueue(scheduler) }
                driver.runDeferred()
            }
            body(driver)
        }.start()
    }
}

/// The thread that watches callback drivers for callbacks that block, every ``tick``; it sleeps while no callback
/// has run for a second, and the next callback wakes it.
final class CallbackWatchdog: Sendable {
    static let shared = CallbackWatchdog()

    static let tick = DispatchTimeInterval.milliseconds(10)
    /// Quiet ticks before it sleeps until the next callback.
    static let ticksBeforeSleeping = 100

    private struct State {
        var drivers: [ObjectIdentifier: CallbackDriver] = [:]
        var started = false
    }

    private let state = Locked(State())
    private let callbacks = Atomic<UInt64>(0)
    private let sleeping = Atomic<Bool>(false)
    private let wakeUp = DispatchSemaphore(value: 0)

    func register(_ driver: CallbackDriver) {
        let start = state.withLock { state -> Bool in
            state.drivers[ObjectIdentifier(driver)] = driver
            defer { state.started = true }
            return !state.started
        }
        if start {
            Thread { [self] in
                nameCurrentThread("wh-watchdog")
                run()
            }.start()
        }
    }

    func unregister(_ driver: CallbackDriver) {
        _ = state.withLock { $0.drivers.removeValue(forKey: ObjectIdentifier(driver)) }
    }

    /// Called as each callback starts: counts it, and wakes the watchdog if it sleeps.
    func noteCallback() {
        // Sequentially consistent, against the watchdog's going to sleep: either it sees this count, or this sees
        // it sleeping.
        callbacks.add(1, ordering: .sequentiallyConsistent)
        if sleeping.load(ordering: .sequentiallyConsistent), sleeping.exchange(false, ordering: .sequentiallyConsistent)
        {
            wakeUp.signal()
        }
    }

    private func run() {
        var quietTicks = 0
        var seen = callbacks.load(ordering: .relaxed)
        while true {
            _ = wakeUp.wait(timeout: .now() + Self.tick)
            let drivers = state.withLock { Array($0.drivers.values) }
            let now = ProcessFacts.coarseMonotonicNanoseconds()
            var busy = false
            for driver in drivers {
                driver.replaceIfBlocked(now: now)
                busy = busy || driver.isInCallback
            }
            let count = callbacks.load(ordering: .relaxed)
            if busy || count != seen {
                quietTicks = 0
                seen = count
                continue
            }
            quietTicks += 1
            guard quietTicks >= Self.ticksBeforeSleeping else { continue }
            quietTicks = 0
            sleeping.store(true, ordering: .sequentiallyConsistent)
            if callbacks.load(ordering: .sequentiallyConsistent) != seen {
                // A callback started meanwhile: stay awake; if its driver already saw this sleep and signalled,
                // take the signal back.
                if !sleeping.exchange(false, ordering: .sequentiallyConsistent) { wakeUp.wait() }
                continue
            }
            wakeUp.wait()
        }
    }
}

/// A thread of its own that runs submitted work in order, one piece at a time, for an engine whose notifications
/// arrive on an event loop (PostgreSQL's live endpoints): the work may block, which the event loop must never.
///
/// It is a ``CallbackDriver``: callbacks that the work schedules with the default execution run on it once the work
/// returns, with no hand-off to the listener's queue; one that blocks for ``CallbackDriver/blockedAfter`` has the
/// thread's work taken over by a new thread, which goes on with the work submitted, and its listener moves to its
/// queue. The work itself (a read from the server, say) is not timed: only callbacks are. The thread ends when
/// ``stop()`` or ``finish()`` is called, or once the work submitted before this value is released has run.
package final class DriverThread: Sendable {
    private let worker: Worker

    /// Starts the thread; `name` is its name as `ps -L` shows it (15 bytes at most).
    package init(name: String) {
        worker = Worker(name: name)
        worker.startThread()
    }

    deinit { finish() }

    /// Runs `work` after everything submitted before it; nothing once stopped.
    package func submit(_ work: @escaping @Sendable () -> Void) { worker.submit(work) }

    /// Ends the thread once the work under way returns; work not yet started is dropped. Idempotent.
    package func stop() { worker.stop() }

    /// Ends the thread once the work submitted so far has run; work submitted after is dropped.
    package func finish() { worker.submit { [worker] in worker.stop() } }

    /// What the thread (and a thread that takes it over) holds, so that the thread does not keep its owner alive.
    private final class Worker: Sendable {
        private struct Inbox {
            var work = ReusableQueue<@Sendable () -> Void>()
            var stopped = false
        }

        private let name: String
        private let inbox = Locked(Inbox())
        /// Counts the work submitted and not yet taken, and the stop.
        private let available = DispatchSemaphore(value: 0)

        init(name: String) { self.name = name }

        func submit(_ work: @escaping @Sendable () -> Void) {
            let accepted = inbox.withLock { inbox -> Bool in
                guard !inbox.stopped else { return false }
                inbox.work.append(work)
                return true
            }
            if accepted { available.signal() }
        }

        func stop() {
            let first = inbox.withLock { inbox -> Bool in
                defer { inbox.stopped = true }
                return !inbox.stopped
            }
            if first { available.signal() }
        }

        func startThread() {
            CallbackDriver.startThread(named: name, handsBacklogsToQueues: false) { [self] driver in run(driver) }
        }

        private func run(_ driver: CallbackDriver) {
            // A thread that was taken over stops here: the one that took over takes the work from now on.
            while !driver.isReplaced {
                available.wait()
                guard let work = inbox.withLock({ $0.stopped ? nil : $0.work.popFirst() }) else { return }
                work()
                driver.runDeferred()
            }
        }
    }
}
