import Dispatch
import Foundation

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
    func add(on execution: CallbackExecution, _ handler: @escaping @Sendable (Value) -> Void) -> Int {
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
            entry.schedule { [self] in
                // Removed since: a handler is not called after its listener was cancelled.
                guard contains(entry.id) else { return }
                Self.run(entry.handler, value)
            }
        }
    }

    private func contains(_ id: Int) -> Bool { entries.withLock { $0[id] != nil } }

    private static var markerKey: String { "wormhole.session.handler" }

    /// Runs a handler with the calling thread marked, so that the session knows not to wait for a delivery that
    /// waits for this very handler.
    private static func run(_ handler: @Sendable (Value) -> Void, _ value: Value) {
        let dictionary = Thread.current.threadDictionary
        let outer = dictionary[markerKey] != nil
        dictionary[markerKey] = true
        defer { if !outer { dictionary.removeObject(forKey: markerKey) } }
        handler(value)
    }

    /// Hands `value` to every handler and returns when all have returned: what is acknowledged afterwards (a user
    /// info transfer, a file) has been handled. Returns false when no handler ran (none was there, or every one was
    /// removed before its turn): then nothing may be acknowledged.
    ///
    /// Called on a session's own queue, never on Swift's cooperative pool.
    @discardableResult
    func deliverAndWait(_ value: Value) -> Bool {
        let current = entries.withLock { $0.sorted { $0.key < $1.key }.map(\.value) }
        guard !current.isEmpty else { return false }
        let ran = Locked(0)
        let group = DispatchGroup()
        for entry in current {
            if entry.runsInline {
                guard contains(entry.id) else { continue }
                Self.run(entry.handler, value)
                ran.withLock { $0 += 1 }
            } else {
                group.enter()
                entry.schedule { [self] in
                    if contains(entry.id) {
                        Self.run(entry.handler, value)
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

/// Whether the calling thread is running a session's handler.
var isRunningSessionHandler: Bool { Thread.current.threadDictionary["wormhole.session.handler"] != nil }

/// Stops consumers: at once, waiting for a delivery under way, unless called from a handler, which that delivery
/// may be waiting for; then in the background.
func cancelConsumers(_ consumers: [any WormholeCancellable]) {
    guard !consumers.isEmpty else { return }
    if isRunningSessionHandler {
        DispatchQueue.global().async { for consumer in consumers { consumer.cancel() } }
    } else {
        for consumer in consumers { consumer.cancel() }
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
