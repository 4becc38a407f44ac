import Foundation

/// The keys and values of a suite: JSON values by key.
///
/// Values are encoded and decoded alike, as messages are (``JSONMessageCoder``): a `Date` as an ISO 8601 string, in
/// whole seconds, and `Data` as Base64.
public struct SuiteValues: Sendable, Equatable {
    /// Each value as compact JSON text: outside an update, every value.
    private var base: [String: Data] = [:]
    /// In the copy an update works on: the keys it set (to a value) or removed (nil), over `base`, which stays the
    /// store's own, untouched. So the store learns what changed without comparing every key, copies no key, and has
    /// nothing to take back when the update fails.
    private var overlay: [String: Data?] = [:]
    /// Which update this copy belongs to; 0 outside an update. A body that replaces the whole value loses it, which
    /// tells the store to compare every key instead.
    private var updateID: UInt64 = 0

    /// Each value as compact JSON text.
    var storage: [String: Data] {
        guard !overlay.isEmpty else { return base }
        var merged = base
        for (key, value) in overlay { merged[key] = value }
        return merged
    }

    /// The one JSON configuration for writing and reading values: a value must read back as what was written.
    static let coder = JSONMessageCoder()

    /// The keys that are set, sorted.
    public var keys: [String] { storage.keys.sorted() }

    /// The value of `key` decoded as `type`, or nil when it is not set or not a `type`.
    public subscript<Value: Decodable>(key: String, as type: Value.Type) -> Value? {
        guard let data = json(forKey: key) else { return nil }
        return try? Self.coder.decode(type, from: data)
    }

    /// Sets the value of a key.
    ///
    /// - Throws: ``WormholeError/Code/encodingFailed`` when the value cannot be encoded as JSON.
    public mutating func set<Value: Encodable>(_ value: Value, forKey key: String) throws(WormholeError) {
        assign(try Self.encode(value, key: key), forKey: key)
    }

    /// Removes a key.
    public mutating func removeValue(forKey key: String) { assign(nil, forKey: key) }

    /// The value of `key` as compact JSON, or nil.
    public func json(forKey key: String) -> Data? {
        if let changed = overlay[key] { return changed }
        return base[key]
    }

    mutating func set(raw: Data?, forKey key: String) { assign(raw, forKey: key) }

    /// Sets a key to JSON text as it is, for engines that store values as JSON; the text must be one compact JSON
    /// value, as ``json(forKey:)`` returns it.
    public mutating func setJSON(_ json: Data, forKey key: String) { assign(json, forKey: key) }

    /// Whether the two hold the same keys and values.
    public static func == (lhs: SuiteValues, rhs: SuiteValues) -> Bool { lhs.storage == rhs.storage }

    private mutating func assign(_ value: Data?, forKey key: String) {
        if updateID != 0 {
            overlay.updateValue(value, forKey: key)
        } else {
            base[key] = value
        }
    }

    // MARK: Updates

    private static let nextUpdateID = Locked<UInt64>(0)

    /// A copy of these values for an update to work on: its changes are kept apart (see ``changes(ofUpdate:)``).
    func updateCopy() -> (copy: SuiteValues, id: UInt64) {
        let id = Self.nextUpdateID.withLock { next in
            next += 1
            return next
        }
        var copy = SuiteValues(storage: storage)
        copy.updateID = id
        return (copy, id)
    }

    /// The keys an update copy changed, each with its new value (nil when removed), sorted by key; nil when the
    /// update replaced the whole copy, so that only comparing every key tells.
    func changes(ofUpdate id: UInt64) -> [(key: String, value: Data?)]? {
        guard updateID == id else { return nil }
        return overlay.compactMap { key, value in base[key] == value ? nil : (key, value) }.sorted { $0.key < $1.key }
    }

    /// Every key whose value differs between these values and `other`, with its value in `other`, sorted by key.
    func differences(to other: SuiteValues) -> [(key: String, value: Data?)] {
        let theirs = other.storage
        return changedKeys(comparedTo: other).sorted().map { ($0, theirs[$0]) }
    }

    /// Applies changes in place: each key takes its value, or is removed when it has none.
    mutating func apply(_ changes: [(key: String, value: Data?)]) {
        for (key, value) in changes {
            overlay.removeValue(forKey: key)
            base[key] = value
        }
    }

    /// Applies a change's values: each of `keys` takes its value in `change`, or is removed when it has none.
    mutating func apply(_ change: SuiteChange) {
        for key in change.keys {
            overlay.removeValue(forKey: key)
            base[key] = change.values.json(forKey: key)
        }
    }

    static func encode<Value: Encodable>(_ value: Value, key: String) throws(WormholeError) -> Data {
        do {
            return try coder.encode(value)
        } catch {
            throw WormholeError(
                .encodingFailed,
                "The value for \"\(key)\" could not be encoded as JSON: \(error).",
                underlyingError: error
            )
        }
    }

    /// The keys whose values differ between the two.
    func changedKeys(comparedTo other: SuiteValues) -> Set<String> {
        let (mine, theirs) = (storage, other.storage)
        return Set(mine.keys).union(theirs.keys).filter { mine[$0] != theirs[$0] }
    }

    /// The value as a Foundation JSON object, for NotificationCenter.
    func foundationObject(forKey key: String) -> Any? {
        json(forKey: key).flatMap { try? JSONSerialization.jsonObject(with: $0, options: [.fragmentsAllowed]) }
    }

    /// Creates an empty set of values.
    public init() {}

    package init(storage: [String: Data]) { self.base = storage }
}

/// A suite file's payload: the values, a version, and the log of recent changes. JSON:
/// `{"version": N, "values": {KEY: VALUE…}, "log": [{"version", "keys", "sender", "direction", "time", "values"}…]}`.
package struct SuiteDocument: Equatable {
    package struct Entry: Equatable {
        package var version: UInt64
        package var keys: [String]
        package var sender: String
        package var direction: String?
        package var time: Int64
        /// The values this change set (removed keys are absent), as compact JSON.
        package var values: [String: Data] = [:]

        package init(
            version: UInt64,
            keys: [String],
            sender: String,
            direction: String?,
            time: Int64,
            values: [String: Data] = [:]
        ) {
            self.version = version
            self.keys = keys
            self.sender = sender
            self.direction = direction
            self.time = time
            self.values = values
        }
    }

    package var version: UInt64 = 0
    package var values = SuiteValues()
    package var log: [Entry] = []

    package init() {}

    package init(decoding data: Data, suite: String) throws(WormholeError) {
        do {
            guard let object = try JSONSerialization.jsonObject(with: data) as? [String: Any],
                let version = (object["version"] as? NSNumber)?.uint64Value,
                let values = object["values"] as? [String: Any]
            else {
                throw WormholeError(
                    .corruptMessage,
                    "The suite file does not hold a suite document.",
                    identifier: suite
                )
            }
            self.version = version
            var storage: [String: Data] = [:]
            for (key, value) in values {
                storage[key] = try JSONSerialization.data(
                    withJSONObject: value,
                    options: [.fragmentsAllowed, .sortedKeys]
                )
            }
            self.values = SuiteValues(storage: storage)
            // Read straight from the parsed objects: a Codable pass over the log on every update costs milliseconds.
            self.log = try (object["log"] as? [[String: Any]] ?? []).map { (entry) throws(WormholeError) -> Entry in
                guard let version = (entry["version"] as? NSNumber)?.uint64Value, let keys = entry["keys"] as? [String],
                    let sender = entry["sender"] as? String, let time = (entry["time"] as? NSNumber)?.int64Value
                else {
                    throw WormholeError(.corruptMessage, "A change in the suite's log is damaged.", identifier: suite)
                }
                var values: [String: Data] = [:]
                for (key, value) in entry["values"] as? [String: Any] ?? [:] {
                    values[key] = try? JSONSerialization.data(
                        withJSONObject: value,
                        options: [.fragmentsAllowed, .sortedKeys]
                    )
                }
                return Entry(
                    version: version,
                    keys: keys,
                    sender: sender,
                    direction: entry["direction"] as? String,
                    time: time,
                    values: values
                )
            }
        } catch let error as WormholeError {
            throw error
        } catch {
            throw WormholeError(
                .corruptMessage,
                "The suite file cannot be read: \(error).",
                identifier: suite,
                underlyingError: error
            )
        }
    }

    package func encoded() throws(WormholeError) -> Data {
        do {
            var values: [String: Any] = [:]
            for (key, data) in self.values.storage {
                values[key] = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
            }
            let logObject: [[String: Any]] = log.map { entry in
                var object: [String: Any] = [
                    "version": entry.version, "keys": entry.keys, "sender": entry.sender, "time": entry.time,
                ]
                if let direction = entry.direction { object["direction"] = direction }
                object["values"] = entry.values.compactMapValues {
                    try? JSONSerialization.jsonObject(with: $0, options: [.fragmentsAllowed])
                }
                return object
            }
            return try JSONSerialization.data(
                withJSONObject: ["version": version, "values": values, "log": logObject] as [String: Any],
                options: [.sortedKeys]
            )
        } catch {
            throw WormholeError(.encodingFailed, "The suite could not be encoded: \(error).", underlyingError: error)
        }
    }
}
