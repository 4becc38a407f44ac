import Dispatch
import Synchronization
import WormholeKit

/// A notifier that wakes observers in this process only, on a serial queue of its own, as a real notifier wakes
/// them on its thread.
///
/// Observers of one name are called in the order of the posts, never at once; a post made from an observer's callback
/// is delivered after that callback returns. ``InMemoryEngine`` uses one; ``ManualNotifier`` is the one to use when a
/// test must decide when observers run.
public final class InMemoryNotifier: Notifier {
    private let observers = ObserverTable()
    private let queue = DispatchQueue(label: "wormhole.in-memory-notifier")

    /// Creates a notifier with no observers.
    public init() {}

    public func post(_ name: String) throws(WormholeError) {
        let handlers = observers.observers(of: name)
        guard !handlers.isEmpty else { return }
        queue.async { [observers] in
            for (id, handler) in handlers {
                // An observation cancelled since the post is not called.
                guard observers.contains(id, of: name) else { continue }
                handler()
            }
        }
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        observers.add(name, handler: handler)
    }

    /// Waits until every post made so far has been delivered: for tests that check what did not happen.
    public func waitUntilIdle() {
        queue.sync {}
    }
}
