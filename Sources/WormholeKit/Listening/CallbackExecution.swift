import Dispatch

/// Where a listener's callbacks run.
///
/// MMWormhole ran every listener on the main thread; here the caller chooses. Callbacks of one listener never
/// overlap and arrive in order wherever they run. To run them on an actor, iterate
/// ``Wormhole/messages(withIdentifier:as:deliveringCurrentMessage:)`` in a task isolated to that actor.
public struct CallbackExecution: Sendable {
    enum Kind: Sendable {
        case queue(DispatchQueue)
        case automatic
        case serialQueue
        case notifierThread
    }
    let kind: Kind

    /// The default: each listener's callbacks run one at a time and in order, never inside the call that starts
    /// listening, and with no hand-off to another thread when they can run on the notifier's own.
    ///
    /// On Linux, a callback for a change that the notifier's thread found (inotify) runs on that thread once the
    /// change is read, as ``notifierThread`` runs it, the fastest path: on a busy CPU a hand-off to another thread
    /// costs a context switch per message. A live listener's or responder's callback runs the same way on the thread
    /// that takes its messages (the socket's on the directory engine, the notifications' on PostgreSQL), which serves
    /// that listener alone. A callback scheduled from any other thread (the message present when listening begins, a
    /// polling or PostgreSQL notifier, Darwin) runs on a serial dispatch queue of the listener's own, as
    /// ``serialQueue`` runs it.
    ///
    /// A callback that keeps the notifier's thread for more than about 20 ms of wall-clock time (measured on a clock
    /// that ticks every few milliseconds, checked every 10 ms; for a queue consumer or a store observer, the library's
    /// reads and writes around the handler count too, though a long backlog is taken in passes of a few milliseconds,
    /// each timed on its own; a thread preempted that long counts too) is not waited for: a new thread takes over the notifier's work, so the
    /// process's other listeners wait for it some tens of milliseconds, once, and this listener's later callbacks run
    /// on its own queue. So callbacks of different listeners that wait for one another are held up, not deadlocked.
    /// Quick callbacks still run one after another on that thread: many of them, or one taking a few milliseconds
    /// each time, delay other listeners of the process, ``notifierThread`` ones included. A listener's callbacks may
    /// run on the notifier's thread and later on its queue, so do not rely on the thread (its thread-local values,
    /// `DispatchQueue.getSpecific`). Choose ``serialQueue`` when no callback may ever delay another listener's, or
    /// when callbacks must always run on one queue.
    public static let automatic = CallbackExecution(kind: .automatic)
    /// A new serial dispatch queue for each listener: callbacks never delay other listeners, and each message costs
    /// a hand-off to the queue's thread.
    public static let serialQueue = CallbackExecution(kind: .serialQueue)
    /// The given dispatch queue; give a serial queue to keep callbacks from overlapping with your other work.
    public static func queue(_ queue: DispatchQueue) -> CallbackExecution { CallbackExecution(kind: .queue(queue)) }
    /// The main queue, as MMWormhole did, for code that updates a user interface.
    public static var main: CallbackExecution { .queue(.main) }
    /// The notifier's own thread, with no hop: the lowest latency, for callbacks that return at once and never
    /// block. A slow callback here delays every other listener of the process.
    public static let notifierThread = CallbackExecution(kind: .notifierThread)

    /// Whether callbacks run on the notifier's thread, where no scheduling is needed.
    var runsOnNotifierThread: Bool {
        if case .notifierThread = kind { return true }
        return false
    }

    /// A function that runs work where this execution says, in order.
    package func makeScheduler(label: String) -> @Sendable (@escaping @Sendable () -> Void) -> Void {
        switch kind {
        case .queue(let queue): return { work in queue.async(execute: work) }
        case .automatic:
            let scheduler = InlineScheduler(label: label)
            return { work in scheduler.schedule(work) }
        case .serialQueue:
            let queue = DispatchQueue(label: label)
            return { work in queue.async(execute: work) }
        case .notifierThread: return { work in work() }
        }
    }
}
