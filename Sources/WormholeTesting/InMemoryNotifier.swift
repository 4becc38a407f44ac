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
    private struct State {
        var observers: [String: [UInt64: @Sendable () -> Void]] = [:]
        var nextID: UInt64 = 1
    }
    private let state = Locked(State())
    private let queue = DispatchQueue(label: "wormhole.in-memory-notifier")

    /// Creates a notifier with no observers.
    public init() {}

    public func post(_ name: String) throws(WormholeError) {
        let handlers = state.withLock { state in (state.observers[name] ?? [:]).sorted { $0.key < $1.key } }
        guard !handlers.isEmpty else { return }
        queue.async { [state] in
            for (id, handler) in handlers {
                // An observation cancelled since the post is not called.
                guard state.withLock({ $0.observers[name]?[id] != nil }) else { continue }
                handler()
            }
        }
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            state.observers[name, default: [:]][state.nextID] = handler
            return state.nextID
        }
        return NotifierObservation { [weak self] in
            self?.state.withLock { state in
                state.observers[name]?[id] = nil
                if state.observers[name]?.isEmpty == true { state.observers[name] = nil }
            }
        }
    }

    /// Waits until every post made so far has been delivered: for tests that check what did not happen.
    public func waitUntilIdle() {
        queue.sync {}
    }
}
