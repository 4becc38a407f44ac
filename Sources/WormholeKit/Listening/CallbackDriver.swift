import CWormholeSystem
import Foundation
import Synchronization

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

    func callbackWillStart(_ scheduler: InlineScheduler) {
        let first = state.withLock { state in
            state.running = (scheduler, ProcessFacts.coarseMonotonicNanoseconds())
            defer { state.watched = true }
            return !state.watched
        }
        if first { CallbackWatchdog.shared.register(self) }
        CallbackWatchdog.shared.noteCallback()
    }

    func callbackDidEnd() {
        state.withLock { $0.running = nil }
    }

    /// Whether a callback is running on the driver's thread now, and the driver may still be replaced (a replaced
    /// one, still running its blocked listener's callbacks, keeps the watchdog awake no longer).
    var isInCallback: Bool { state.withLock { $0.running != nil && !$0.replaced } }

    /// Called by the watchdog: when a callback has held the thread since before `now - blockedAfter`, marks the
    /// driver replaced, moves its listener to its dispatch queue, and hands the work not yet started to a new thread.
    func replaceIfBlocked(now: UInt64) {
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
