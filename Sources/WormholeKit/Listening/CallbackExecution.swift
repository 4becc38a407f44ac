import Dispatch

/// Where a listener's callbacks run.
///
/// MMWormhole ran every listener on the main thread; here the caller chooses. Callbacks of one listener never
/// overlap and arrive in order wherever they run. To run them on an actor, iterate
/// ``Wormhole/messages(withIdentifier:as:deliveringCurrentMessage:)`` in a task isolated to that actor.
public struct CallbackExecution: Sendable {
    enum Kind: Sendable {
        case queue(DispatchQueue)
        case serialQueue
        case notifierThread
    }
    let kind: Kind

    /// A new serial dispatch queue for each listener (the default): callbacks never block other listeners.
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
        case .serialQueue:
            let queue = DispatchQueue(label: label)
            return { work in queue.async(execute: work) }
        case .notifierThread: return { work in work() }
        }
    }
}
