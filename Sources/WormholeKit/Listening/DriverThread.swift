import CWormholeSystem
import Foundation
import Synchronization

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
