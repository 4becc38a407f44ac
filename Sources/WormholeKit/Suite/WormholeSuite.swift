import Foundation
import Logging
import Synchronization

/// A set of keys and values shared by the processes of a group, with change notifications: `UserDefaults(suiteName:)`
/// plus Darwin notifications, the pattern many app groups use, done so that no update is lost and no change goes
/// unnoticed.
///
/// ```swift
/// let settings = try wormhole.suite("settings")
/// try settings.set("dark", forKey: "theme", direction: "app→widget")
/// try settings.update { values in                         // several keys, atomically, across processes
///     try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
///     try values.set("app", forKey: "updatedBy")
/// }
/// let observer = try settings.observe(keys: ["theme"]) { change in
///     print(change.keys, "changed by", change.sender)     // other processes' changes; own ones are skipped
/// }
/// ```
///
/// Each change records its sender and an optional direction (such as `app→widget`), so a process can ignore its
/// own writes or listen to one direction only. Values are JSON. The wormhole's engine stores the suite (a
/// ``SuiteStore``): in a directory, one file, a log to which each update appends the keys it changed, so that an
/// update costs the same whatever the size of the suite.
public final class WormholeSuite: Sendable {
    /// The suite's name.
    public let name: String
    /// This process's sender name in the changes it makes.
    public let sender: String
    /// The engine's store of this suite.
    public let store: any SuiteStore
    let logger: Logger

    init(name: String, wormhole: Wormhole) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.sender = wormhole.sender
        self.store = try wormhole.engine.suiteStore(name)
        self.logger = wormhole.logger
    }

    // MARK: Reading

    /// The value of a key, or nil when the key is not set.
    ///
    /// Nil also when the value is not a `type`.
    public func value<Value: Decodable>(
        forKey key: String,
        as type: Value.Type = Value.self
    ) throws(WormholeError) -> Value? {
        try snapshot()[key, as: type]
    }

    /// Every key and value, read at once.
    public func snapshot() throws(WormholeError) -> SuiteValues {
        try store.read().values
    }

    // MARK: Writing

    /// Sets one key.
    public func set<Value: Encodable>(
        _ value: Value,
        forKey key: String,
        direction: String? = nil
    ) throws(WormholeError) {
        let encoded = try SuiteValues.encode(value, key: key)
        try store.update(sender: sender, direction: direction) { values in values.set(raw: encoded, forKey: key) }
    }

    /// Sets one key to a JSON value given as text or bytes, as it is (from a shell, another language).
    ///
    /// - Throws: ``WormholeError/Code/encodingFailed`` when `json` is not valid JSON; nothing is changed then.
    public func setJSON(_ json: Data, forKey key: String, direction: String? = nil) throws(WormholeError) {
        let compact: Data
        do {
            let object = try JSONSerialization.jsonObject(with: json, options: [.fragmentsAllowed])
            compact = try JSONSerialization.data(withJSONObject: object, options: [.fragmentsAllowed, .sortedKeys])
        } catch {
            throw WormholeError(
                .encodingFailed,
                "The value for \"\(key)\" is not valid JSON: \(error).",
                identifier: name,
                underlyingError: error
            )
        }
        try store.update(sender: sender, direction: direction) { values in values.set(raw: compact, forKey: key) }
    }

    /// Removes one key.
    public func removeValue(forKey key: String, direction: String? = nil) throws(WormholeError) {
        try store.update(sender: sender, direction: direction) { values in values.set(raw: nil, forKey: key) }
    }

    /// Changes any number of keys in one step, atomically for every process: `body` sees the current values, and no
    /// other process's update comes in between its read and its write. The observers are told once, with every key
    /// it changed. `body` reads and changes `values`, and must not call this suite. On a directory and in memory it
    /// runs once, under the suite's lock; on PostgreSQL it runs with no lock held, and runs again when another
    /// update came in between (so that a process stopped in it holds nobody up): keep it free of other effects.
    ///
    /// ```swift
    /// try settings.update { values in
    ///     try values.set((values["count", as: Int.self] ?? 0) + 1, forKey: "count")
    /// }
    /// ```
    ///
    /// - Throws: ``WormholeError/Code/handlerFailed`` when `body` throws an error of its own (nothing is changed
    ///   then), or the ``WormholeError`` it threw, and the store's codes.
    public func update(direction: String? = nil, _ body: (inout SuiteValues) throws -> Void) throws(WormholeError) {
        try store.update(sender: sender, direction: direction) { (values) throws(WormholeError) in
            do {
                try body(&values)
            } catch let error as WormholeError {
                throw error
            } catch {
                throw .handlerFailed(error, "while updating the suite; nothing was changed", identifier: name)
            }
        }
    }

    // MARK: Observing

    /// Calls `handler` after each change to the suite, in any process, in order.
    ///
    /// - Parameters:
    ///   - keys: The keys of interest; changes to others are not reported. Nil for every key.
    ///   - includingOwnChanges: Whether changes made through this process's suite (its ``sender``) are reported.
    ///   - direction: Only changes made with this direction; nil for all.
    ///   - notificationCenter: If given, each changed key is also posted there as a notification named like the key,
    ///     its object the new value (a Foundation JSON object, nil when removed), as app groups often repost Darwin
    ///     notifications.
    ///   - execution: Where `handler` runs (and the notifications are posted); by default
    ///     ``CallbackExecution/automatic``: in order, on the notifier's thread while it returns quickly.
    ///   - errorHandler: Called when the suite cannot be read; observing goes on. When nil, the error is logged.
    ///   - handler: Called with each change.
    /// - Returns: The observer; it stops when cancelled or released.
    public func observe(
        keys: Set<String>? = nil,
        includingOwnChanges: Bool = false,
        direction: String? = nil,
        repostingTo notificationCenter: NotificationCenter? = nil,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (SuiteChange) -> Void
    ) throws(WormholeError) -> SuiteObserver {
        // What this observer has reported, set once it is registered (below): nil until then.
        let seen = Locked<SuiteState?>(nil)
        let schedule = execution.makeScheduler(label: "wormhole.suite.\(name)")
        let center = UncheckedSendableBox(notificationCenter)
        let observer = SuiteObserver(name: name)
        let observation = try store.observe { [self, weak observer] in
            guard let observer, !observer.isCancelled else { return }
            // Under the lock of this observer: changes are computed and handed over in order.
            let changes: [SuiteChange]
            do throws(WormholeError) {
                changes = try seen.withLock { (started) throws(WormholeError) -> [SuiteChange] in
                    // Not started: the state read under this lock, after registering, holds this change.
                    guard started != nil else { return [] }
                    // Changed in place (`started!`): a copy would make the values copy every key.
                    return try Self.changes(
                        of: store,
                        since: &started!,
                        sender: sender,
                        keys: keys,
                        includingOwnChanges: includingOwnChanges,
                        direction: direction
                    )
                }
            } catch {
                schedule { [self] in report(error, to: errorHandler) }
                return
            }
            for change in changes {
                schedule { [weak observer] in
                    guard let observer, !observer.isCancelled else { return }
                    handler(change)
                    if let center = center.value {
                        for key in change.keys.sorted() {
                            center.post(
                                name: Notification.Name(key),
                                object: change.values.foundationObject(forKey: key)
                            )
                        }
                    }
                }
            }
        }
        // Read after registering, under the observer's lock: a change made before the read is in the state read, and
        // one made after it posts to this observer, which then finds it.
        do throws(WormholeError) {
            try seen.withLock { (started) throws(WormholeError) in started = try store.read() }
        } catch {
            observation.cancel()
            throw error
        }
        observer.attach(observation)
        return observer
    }

    /// The changes since `seen`, filtered for an observer, with `seen` brought up to the store's state.
    private static func changes(
        of store: any SuiteStore,
        since seen: inout SuiteState,
        sender: String,
        keys: Set<String>?,
        includingOwnChanges: Bool,
        direction: String?
    ) throws(WormholeError) -> [SuiteChange] {
        let (current, logged) = try store.changes(after: seen.version)
        // Another lineage, or a lower version: the suite started over (its file was removed, say), and only the
        // difference of the values can be reported. (Lineage 0: no history yet, a suite never written.)
        let restarted = (seen.lineage != 0 && current.lineage != seen.lineage) || current.version < seen.version
        guard current.version > seen.version || restarted else { return [] }
        let result: [SuiteChange]
        if let logged, !restarted {
            result = logged
            // The changes applied to this observer's own copy: keeping the store's copy instead would make the store
            // copy every key at its next update.
            for change in logged { seen.values.apply(change) }
            seen.version = current.version
            // And its lineage: an observer that began before the suite had one would otherwise never see it restart.
            seen.lineage = current.lineage
        } else {
            defer { seen = current }
            // More changes than the store keeps came at once: report the difference, by an unknown sender.
            let keys = seen.values.changedKeys(comparedTo: current.values)
            guard !keys.isEmpty else { return [] }
            result = [
                SuiteChange(
                    version: current.version,
                    keys: keys,
                    sender: "",
                    direction: nil,
                    timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
                    values: SuiteValues(storage: current.values.storage.filter { keys.contains($0.key) })
                )
            ]
        }
        return result.compactMap { change in
            if !includingOwnChanges && change.sender == sender { return nil }
            if let direction, change.direction != direction { return nil }
            guard let keys else { return change }
            var filtered = change
            filtered.keys = change.keys.intersection(keys)
            return filtered.keys.isEmpty ? nil : filtered
        }
    }

    /// The changes to the suite, as an `AsyncSequence`; the same changes as
    /// ``observe(keys:includingOwnChanges:direction:repostingTo:on:errorHandler:handler:)`` reports.
    ///
    /// The observer is registered when this method returns, so no change made after the call is missed. An error
    /// reading the suite ends the sequence with it.
    public func changes(
        keys: Set<String>? = nil,
        includingOwnChanges: Bool = false,
        direction: String? = nil
    ) -> ListeningSequence<SuiteChange> {
        ListeningSequence { (continuation) throws(WormholeError) in
            try observe(
                keys: keys,
                includingOwnChanges: includingOwnChanges,
                direction: direction,
                on: .notifierThread,
                errorHandler: { continuation.finish(throwing: $0) }
            ) { change in continuation.yield(change) }
        }
    }

    func report(_ error: WormholeError, to handler: (@Sendable (WormholeError) -> Void)?) {
        ErrorReporting.report(error, to: handler, logger: logger, context: "suite \(name)")
    }
}
/// Holds a non-Sendable reference that is only used as the caller said (NotificationCenter is thread-safe).
struct UncheckedSendableBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension Wormhole {
    /// The shared key-value suite named `name`, stored by this wormhole's engine.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError/Code/unsupported`` when the
    ///   wormhole's engine has no suites.
    public func suite(_ name: String) throws(WormholeError) -> WormholeSuite {
        try WormholeSuite(name: name, wormhole: self)
    }
}
