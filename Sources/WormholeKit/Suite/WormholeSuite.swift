import Foundation
import Synchronization

/// A set of keys and values shared by the processes of a group, with change notifications: `UserDefaults(suiteName:)`
/// plus Darwin notifications, the pattern of seed 002, done so that no update is lost and no change goes unnoticed.
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
/// own writes or listen to one direction only. Values are JSON. A suite is one file in the wormhole directory,
/// written as a mailbox is (two checksummed slots, under a lock), holding the values and a log of the last 64
/// changes.
public final class WormholeSuite: Sendable {
    /// The suite's name.
    public let name: String
    /// This process's sender name in the changes it makes.
    public let sender: String
    let files: FileTransiting
    let notifier: any Notifier
    let fileName: String
    var notificationName: String { "suite." + name }
    static let logLimit = 64

    init(name: String, wormhole: Wormhole) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        guard let files = (wormhole.transiting as? FileTransiting)
            ?? (wormhole.transiting as? CoordinatedFileTransiting)?.files
        else {
            throw WormholeError(
                .directoryUnavailable, "Suites live in a directory; this wormhole was made with a custom transiting.",
                identifier: name)
        }
        self.name = name
        self.sender = wormhole.sender
        self.files = files
        self.notifier = wormhole.notifier
        self.fileName = name + ".suite"
    }

    // MARK: Reading

    /// The value of a key, or nil when the key is not set.
    public func value<Value: Decodable>(forKey key: String, as type: Value.Type = Value.self) throws(WormholeError) -> Value? {
        try snapshot()[key, as: type]
    }

    /// Every key and value, read at once.
    public func snapshot() throws(WormholeError) -> SuiteValues {
        try document().values
    }

    func document() throws(WormholeError) -> SuiteDocument {
        guard let envelope = try files.read(fileName: fileName, identifier: name) else { return SuiteDocument() }
        return try SuiteDocument(decoding: envelope.payload, suite: name)
    }

    // MARK: Writing

    /// Sets one key.
    public func set<Value: Encodable>(_ value: Value, forKey key: String, direction: String? = nil) throws(WormholeError) {
        let encoded = try SuiteValues.encode(value, key: key)
        try update(direction: direction) { (values: inout SuiteValues) throws(WormholeError) in values.set(raw: encoded, forKey: key) }
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
                .encodingFailed, "The value for \"\(key)\" is not valid JSON: \(error).", identifier: name,
                underlyingError: error)
        }
        try update(direction: direction) { (values: inout SuiteValues) throws(WormholeError) in values.set(raw: compact, forKey: key) }
    }

    /// Removes one key.
    public func removeValue(forKey key: String, direction: String? = nil) throws(WormholeError) {
        try update(direction: direction) { (values: inout SuiteValues) throws(WormholeError) in values.set(raw: nil, forKey: key) }
    }

    /// Changes any number of keys in one step, atomically for every process: `body` sees the current values, and no
    /// other process's update comes in between its read and its write. The observers are told once, with every key
    /// it changed.
    public func update(
        direction: String? = nil, _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) {
        var changed = false
        _ = try files.modify(fileName: fileName, identifier: name, sender: sender) { (current) throws(WormholeError) in
            var document = try current.map { (data) throws(WormholeError) in try SuiteDocument(decoding: data, suite: name) }
                ?? SuiteDocument()
            var values = document.values
            try body(&values)
            let keys = document.values.changedKeys(comparedTo: values)
            changed = !keys.isEmpty
            if changed {
                document.version += 1
                document.values = values
                document.log.append(
                    SuiteDocument.Entry(
                        version: document.version, keys: keys.sorted(), sender: sender, direction: direction,
                        time: ProcessFacts.wallClockNanoseconds(),
                        values: values.storage.filter { keys.contains($0.key) }))
                if document.log.count > Self.logLimit { document.log.removeFirst(document.log.count - Self.logLimit) }
            }
            return try document.encoded()
        }
        if changed { try notifier.post(notificationName) }
    }

    // MARK: Observing

    /// Calls `handler` after each change to the suite, in any process, in order.
    ///
    /// - Parameters:
    ///   - keys: The keys of interest; changes to others are not reported. Nil for every key.
    ///   - includingOwnChanges: Whether changes made through this process's suite (its ``sender``) are reported.
    ///   - direction: Only changes made with this direction; nil for all.
    ///   - notificationCenter: If given, each changed key is also posted there as a notification named like the key,
    ///     its object the new value (a Foundation JSON object, nil when removed), as seed 002 reposts.
    ///   - execution: Where `handler` runs.
    public func observe(
        keys: Set<String>? = nil,
        includingOwnChanges: Bool = false,
        direction: String? = nil,
        repostingTo notificationCenter: NotificationCenter? = nil,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (SuiteChange) -> Void
    ) throws(WormholeError) -> SuiteObserver {
        let start = try document()
        let state = Locked<(version: UInt64, values: SuiteValues)>((start.version, start.values))
        let schedule = execution.makeScheduler(label: "wormhole.suite.\(name)")
        let center = UncheckedSendableBox(notificationCenter)
        let observation = try notifier.observe(notificationName) { [self] in
            let current: SuiteDocument
            do throws(WormholeError) {
                current = try document()
            } catch {
                errorHandler?(error)
                return
            }
            // Under the lock of this observer: changes are computed and handed over in order.
            let changes: [SuiteChange] = state.withLock { seen in
                defer { seen = (current.version, current.values) }
                guard current.version > seen.version else { return [] }
                let logged = current.log.filter { $0.version > seen.version }
                var result: [SuiteChange]
                if logged.first?.version == seen.version + 1 {
                    result = logged.map { SuiteChange(entry: $0) }
                } else {
                    // More changes than the log keeps came at once: report the difference, by an unknown sender.
                    let keys = seen.values.changedKeys(comparedTo: current.values)
                    result = [SuiteChange(version: current.version, keys: keys, sender: "", direction: nil,
                        timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
                        values: SuiteValues(storage: current.values.storage.filter { keys.contains($0.key) }))]
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
            for change in changes {
                schedule {
                    handler(change)
                    if let center = center.value {
                        for key in change.keys.sorted() {
                            center.post(name: Notification.Name(key), object: change.values.foundationObject(forKey: key))
                        }
                    }
                }
            }
        }
        return SuiteObserver(observation: observation)
    }
}

/// A suite observer; it stops when cancelled or released.
public final class SuiteObserver: Sendable {
    private let observation: NotifierObservation

    init(observation: NotifierObservation) { self.observation = observation }

    /// Stops observing.
    public func cancel() { observation.cancel() }

    deinit { cancel() }
}

/// One change to a suite, as an observer receives it.
public struct SuiteChange: Sendable, Equatable {
    /// The suite's version after the change.
    public var version: UInt64
    /// The keys it changed (among those observed).
    public var keys: Set<String>
    /// Who made it (empty when unknown: more changes came at once than the suite's log keeps).
    public var sender: String
    /// The direction it was made with, if any.
    public var direction: String?
    /// When it was made, in nanoseconds since 1970.
    public var timestampNanoseconds: Int64
    /// The values this change set; a removed key is absent.
    public var values: SuiteValues

    init(version: UInt64, keys: Set<String>, sender: String, direction: String?, timestampNanoseconds: Int64, values: SuiteValues) {
        self.version = version
        self.keys = keys
        self.sender = sender
        self.direction = direction
        self.timestampNanoseconds = timestampNanoseconds
        self.values = values
    }

    init(entry: SuiteDocument.Entry) {
        self.init(
            version: entry.version, keys: Set(entry.keys), sender: entry.sender, direction: entry.direction,
            timestampNanoseconds: entry.time, values: SuiteValues(storage: entry.values))
    }
}

/// Holds a non-Sendable reference that is only used as the caller said (NotificationCenter is thread-safe).
struct UncheckedSendableBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension Wormhole {
    /// The shared key-value suite named `name` in this wormhole's directory.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError/Code/directoryUnavailable`` for a
    ///   wormhole made with a custom transiting.
    public func suite(_ name: String) throws(WormholeError) -> WormholeSuite {
        try WormholeSuite(name: name, wormhole: self)
    }
}
