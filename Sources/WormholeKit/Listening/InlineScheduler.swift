import Foundation

// The default callback execution, `CallbackExecution.automatic`: a listener's callbacks run one at a time and in
// order, on the notifier's own thread when they are scheduled there (no hand-off to another thread, which on a busy
// CPU costs a context switch per message), and on a serial dispatch queue of the listener's own otherwise. A callback
// that blocks the notifier's thread for longer than `CallbackDriver.blockedAfter` has the thread's work taken over by
// a new thread (the way Go hands off a blocked thread's work), and its listener moves to its dispatch queue for good.

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
    func markBlocking() { state.withLock { $0.blocksDrivers = true } }
}
