import Synchronization
import WormholeKit

/// A notifier that delivers only when the test says so, on the test's own thread.
///
/// Posts are recorded in ``postedNames``; ``deliverPendingNotifications()`` calls the observers of every name
/// posted since the last delivery, once per name. With `deliversImmediately`, a post calls the observers at
/// once instead.
public final class ManualNotifier: Notifier {
    private struct State {
        var pending: [String] = []
        var posted: [String] = []
    }
    private let state = Locked(State())
    private let observers = ObserverTable()
    private let delivering = Locked(())
    /// Whether a post calls the observers at once, on the posting thread.
    public let deliversImmediately: Bool

    /// Creates a notifier; by default posts wait for ``deliverPendingNotifications()``.
    public init(deliversImmediately: Bool = false) {
        self.deliversImmediately = deliversImmediately
    }

    /// Every name posted so far, in order.
    public var postedNames: [String] { state.withLock { $0.posted } }

    /// How many observations are active.
    public var observationCount: Int { observers.count }

    public func post(_ name: String) throws(WormholeError) {
        state.withLock { state in
            state.posted.append(name)
            if !state.pending.contains(name) { state.pending.append(name) }
        }
        if deliversImmediately { deliverPendingNotifications() }
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        observers.add(name, handler: handler)
    }

    /// Calls the observers of each name posted since the last delivery; returns how many calls were made.
    @discardableResult
    public func deliverPendingNotifications() -> Int {
        // One delivery at a time, so that observers' calls never overlap, as the Notifier contract says.
        delivering.withLock { _ in
            let names = state.withLock { state in
                defer { state.pending = [] }
                return state.pending
            }
            let handlers = names.flatMap { name in observers.observers(of: name).map(\.handler) }
            for handler in handlers { handler() }
            return handlers.count
        }
    }
}
