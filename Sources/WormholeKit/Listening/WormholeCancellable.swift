/// A handle on something that listens: a mailbox listener, a queue consumer, a live listener or responder, a suite
/// observer, a transfer receiver, a store's remote-change observer.
///
/// Every way of listening returns one. Keep it as long as you want to listen: listening stops when it is cancelled
/// or released. ``isCancelled`` becomes true however listening stopped, by ``cancel()`` or otherwise (for a
/// mailbox listener, ``Wormhole/stopListeningForMessage(withIdentifier:)``).
public protocol WormholeCancellable: AnyObject, Sendable {
    /// Stops listening. A callback under way finishes; none starts after this returns.
    func cancel()

    /// Whether listening has stopped.
    var isCancelled: Bool { get }
}
