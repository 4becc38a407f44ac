import WormholeKit

/// The observers of a test notifier, by name: what ``ManualNotifier`` and ``InMemoryNotifier`` share.
final class ObserverTable: Sendable {
    private struct State {
        var observers: [String: [UInt64: @Sendable () -> Void]] = [:]
        var nextID: UInt64 = 1
    }
    private let state = Locked(State())

    /// Adds an observer of `name`; it is removed when the returned observation ends.
    func add(_ name: String, handler: @escaping @Sendable () -> Void) -> NotifierObservation {
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

    /// The observers of `name` now, oldest first.
    func observers(of name: String) -> [(id: UInt64, handler: @Sendable () -> Void)] {
        state.withLock { ($0.observers[name] ?? [:]).sorted { $0.key < $1.key }.map { ($0.key, $0.value) } }
    }

    /// Whether the observer `id` of `name` is still there.
    func contains(_ id: UInt64, of name: String) -> Bool {
        state.withLock { $0.observers[name]?[id] != nil }
    }

    /// How many observations are active.
    var count: Int { state.withLock { $0.observers.values.reduce(0) { $0 + $1.count } } }
}
