import Dispatch

/// The callbacks a session holds for one kind of event, each with where it runs.
///
/// A session's handlers are registered on the session, not on the engine: they may be set before ``WormholeSession/activate()``
/// (as WatchConnectivity asks of its delegate) and the session starts taking events of a kind only once one is there.
final class SessionHandlers<Value: Sendable>: Sendable {
    private struct Entry: Sendable {
        let id: Int
        let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
        let runsInline: Bool
        let handler: @Sendable (Value) -> Void
    }
    private let entries = Locked<[Int: Entry]>([:])
    private let nextID = Locked(0)
    private let label: String

    init(label: String) { self.label = label }

    /// Adds a handler; returns its id for ``remove(_:)``.
    private func add(on execution: CallbackExecution, _ handler: @escaping @Sendable (Value) -> Void) -> Int {
        let id = nextID.withLock { (next) -> Int in
            next += 1
            return next
        }
        let entry = Entry(
            id: id,
            schedule: execution.makeScheduler(label: "wormhole.session.\(label).\(id)"),
            runsInline: execution.runsOnNotifierThread,
            handler: handler
        )
        entries.withLock { $0[id] = entry }
        return id
    }

    /// Adds a handler, removed when the returned listener is cancelled or released.
    func listen(on execution: CallbackExecution, _ handler: @escaping @Sendable (Value) -> Void) -> SessionListener {
        let id = add(on: execution, handler)
        return SessionListener { [self] in remove(id) }
    }

    /// Removes a handler.
    private func remove(_ id: Int) {
        _ = entries.withLock { $0.removeValue(forKey: id) }
    }

    var isEmpty: Bool { entries.withLock { $0.isEmpty } }

    /// Hands `value` to every handler where it runs, without waiting.
    func deliver(_ value: Value) {
        for entry in entries.withLock({ $0.sorted { $0.key < $1.key }.map(\.value) }) {
            entry.schedule { [self] in
                // Removed since: a handler is not called after its listener was cancelled.
                guard contains(entry.id) else { return }
                entry.handler(value)
            }
        }
    }

    private func contains(_ id: Int) -> Bool { entries.withLock { $0[id] != nil } }

    /// Hands `value` to every handler and returns when all have returned: what is acknowledged afterwards (a user
    /// info transfer, a file) has been handled. Returns false when no handler ran (none was there, or every one was
    /// removed before its turn): then nothing may be acknowledged.
    ///
    /// Called on a session's own queue, never on Swift's cooperative pool, and never on a callback driver's thread
    /// (the notifier's), where handlers with the default execution would wait for this call to return.
    @discardableResult
    func deliverAndWait(_ value: Value) -> Bool {
        assert(CallbackDriver.current == nil, "deliverAndWait on the notifier's thread would wait for itself")
        let current = entries.withLock { $0.sorted { $0.key < $1.key }.map(\.value) }
        guard !current.isEmpty else { return false }
        let ran = Locked(0)
        let group = DispatchGroup()
        for entry in current {
            if entry.runsInline {
                guard contains(entry.id) else { continue }
                entry.handler(value)
                ran.withLock { $0 += 1 }
            } else {
                group.enter()
                entry.schedule { [self] in
                    if contains(entry.id) {
                        entry.handler(value)
                        ran.withLock { $0 += 1 }
                    }
                    group.leave()
                }
            }
        }
        group.wait()
        return ran.withLock { $0 } > 0
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
