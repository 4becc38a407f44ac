import Dispatch

/// The callbacks a session holds for one kind of event, each with where it runs.
///
/// A session's handlers are registered on the session, not on the engine: they may be set before ``WormholeSession/activate()``
/// (as WatchConnectivity asks of its delegate) and the session starts taking events of a kind only once one is there.
final class SessionHandlers<Value: Sendable>: Sendable {
    private struct Entry: Sendable {
        let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
        let runsInline: Bool
        let handler: @Sendable (Value) -> Void
    }
    private let entries = Locked<[Int: Entry]>([:])
    private let nextID = Locked(0)
    private let label: String

    init(label: String) { self.label = label }

    /// Adds a handler; returns its id for ``remove(_:)``.
    func add(on execution: CallbackExecution, _ handler: @escaping @Sendable (Value) -> Void) -> Int {
        let id = nextID.withLock { (next) -> Int in
            next += 1
            return next
        }
        let entry = Entry(
            schedule: execution.makeScheduler(label: "wormhole.session.\(label).\(id)"),
            runsInline: execution.runsOnNotifierThread,
            handler: handler
        )
        entries.withLock { $0[id] = entry }
        return id
    }

    /// Removes a handler; returns whether none is left.
    @discardableResult
    func remove(_ id: Int) -> Bool {
        entries.withLock { entries in
            entries[id] = nil
            return entries.isEmpty
        }
    }

    var isEmpty: Bool { entries.withLock { $0.isEmpty } }

    /// Hands `value` to every handler where it runs, without waiting.
    func deliver(_ value: Value) {
        for entry in entries.withLock({ $0.sorted { $0.key < $1.key }.map(\.value) }) {
            entry.schedule { entry.handler(value) }
        }
    }

    /// Hands `value` to every handler and returns when all have returned: what is acknowledged afterwards (a user
    /// info transfer, a file) has been handled. Returns false when there was no handler.
    ///
    /// Called on a session's own queue, never on Swift's cooperative pool.
    @discardableResult
    func deliverAndWait(_ value: Value) -> Bool {
        let current = entries.withLock { $0.sorted { $0.key < $1.key }.map(\.value) }
        guard !current.isEmpty else { return false }
        let group = DispatchGroup()
        for entry in current {
            if entry.runsInline {
                entry.handler(value)
            } else {
                group.enter()
                entry.schedule {
                    entry.handler(value)
                    group.leave()
                }
            }
        }
        group.wait()
        return true
    }
}

/// A handler registered on a ``WormholeSession``; the handler is removed when this is cancelled or released.
public final class SessionListener: WormholeCancellable {
    private let removal: Locked<(@Sendable () -> Void)?>

    init(remove: @escaping @Sendable () -> Void) { removal = Locked(remove) }

    /// Removes the handler: it is not called after this returns (unless a call is under way).
    public func cancel() {
        let remove = removal.withLock { (removal) -> (@Sendable () -> Void)? in
            defer { removal = nil }
            return removal
        }
        remove?()
    }

    /// Whether the handler was removed.
    public var isCancelled: Bool { removal.withLock { $0 == nil } }

    deinit { cancel() }
}
