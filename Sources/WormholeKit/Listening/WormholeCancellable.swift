/// A handle on something that listens: a mailbox listener, a queue consumer, a live listener or responder, a suite
/// observer, a transfer receiver, a store's remote-change observer.
///
/// Every way of listening returns one. Keep it as long as you want to listen: listening stops when it is cancelled
/// or released. ``isCancelled`` becomes true however listening stopped, by ``cancel()`` or otherwise (for a
/// mailbox listener, ``Wormhole/stopListeningForMessage(withIdentifier:)``).
public protocol WormholeCancellable: AnyObject, Sendable {
    /// Stops listening: no callback is handed over once this returns, and callbacks scheduled but not started are
    /// skipped.
    ///
    /// A callback under way finishes, and so may one that another thread was starting at that very moment: only a
    /// queue consumer (``QueueConsumer/cancel()``) waits for its handler, which it must acknowledge. The others do
    /// not wait, so that cancelling from anywhere, a callback or a thread a callback waits for, never deadlocks.
    func cancel()

    /// Whether listening has stopped.
    var isCancelled: Bool { get }
}
