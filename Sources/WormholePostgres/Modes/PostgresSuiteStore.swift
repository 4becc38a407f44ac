import Foundation
import PostgresNIO
import WormholeKit

/// A suite in `wormhole.suites` (its version), `wormhole.suite_values` (one row per key, the value's JSON text as
/// written) and `wormhole.suite_changes` (the last ``logLimit`` changes, for observers that catch up).
///
/// An update locks the suite's row for its transaction, so updates from every host come one after the other, and
/// writes only the keys that changed.
final class PostgresSuiteStore: SuiteStore {
    let engine: PostgresCore
    let name: String
    /// How many changes are kept, as a directory suite keeps 64.
    static let logLimit: Int64 = 64

    init(engine: PostgresCore, name: String) {
        self.engine = engine
        self.name = name
    }

    func read() throws(WormholeError) -> SuiteState {
        try engine.connections.withConnection { (connection) throws(WormholeError) in
            try read(on: connection, locking: false)
        }
    }

    private func read(on connection: PostgresConnection, locking: Bool) throws(WormholeError) -> SuiteState {
        let what = "reading the suite \(name)"
        var values = SuiteValues()
        if !locking {
            // The version and the values in one statement: one snapshot, never values newer than their version.
            let rows = try engine.connections.run(
                """
                SELECT s.version, v.key, v.value
                FROM (SELECT coalesce((SELECT version FROM wormhole.suites
                    WHERE grp = \(engine.group) AND suite = \(name)), 0) AS version) s
                LEFT JOIN wormhole.suite_values v ON v.grp = \(engine.group) AND v.suite = \(name)
                """,
                on: connection,
                doing: what
            )
            var version: Int64 = 0
            for row in rows {
                do {
                    let (number, key, value) = try row.decode((Int64, String?, String?).self)
                    version = number
                    if let key, let value { values.setJSON(Data(value.utf8), forKey: key) }
                } catch {
                    throw WormholeError(
                        .corruptMessage,
                        "Unexpected columns while \(what): \(error).",
                        identifier: name
                    )
                }
            }
            return SuiteState(version: try checkedVersion(version), values: values)
        }
        // Makes the row if it is missing, and locks it until the transaction ends: no update comes in between.
        let locked = try engine.connections.run(
            """
            INSERT INTO wormhole.suites AS s (grp, suite) VALUES (\(engine.group), \(name))
            ON CONFLICT (grp, suite) DO UPDATE SET version = s.version RETURNING s.version
            """,
            on: connection,
            doing: what
        )
        let version = try decode(Int64.self, locked.first, doing: what)
        let rows = try engine.connections.run(
            "SELECT key, value FROM wormhole.suite_values WHERE grp = \(engine.group) AND suite = \(name)",
            on: connection,
            doing: what
        )
        for row in rows {
            do {
                let (key, value) = try row.decode((String, String).self)
                values.setJSON(Data(value.utf8), forKey: key)
            } catch {
                throw WormholeError(.corruptMessage, "Unexpected columns while \(what): \(error).", identifier: name)
            }
        }
        return SuiteState(version: try checkedVersion(version), values: values)
    }

    /// The suite's version as read: in range, and not the last `bigint`, so that an update can add one.
    private func checkedVersion(_ version: Int64, _ column: String = "version") throws(WormholeError) -> UInt64 {
        try RowValues.count(
            version,
            column,
            of: "suites",
            row: "the suite \(name) of group \(engine.group)",
            identifier: name
        )
    }

    func update(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> SuiteChange? {
        let what = "updating the suite \(name)"
        return try engine.connections.transaction(doing: what) { (connection) throws(WormholeError) -> SuiteChange? in
            let current = try read(on: connection, locking: true)
            var values = current.values
            try body(&values)
            let keys = Set(values.keys).union(current.values.keys).filter {
                values.json(forKey: $0) != current.values.json(forKey: $0)
            }
            guard !keys.isEmpty else { return nil }
            var changed = SuiteValues()
            var setKeys: [String] = []
            var setValues: [String] = []
            var removed: [String] = []
            for key in keys.sorted() {
                if let json = values.json(forKey: key) {
                    changed.setJSON(json, forKey: key)
                    setKeys.append(key)
                    setValues.append(String(decoding: json, as: UTF8.self))
                } else {
                    removed.append(key)
                }
            }
            let version = Int64(current.version) + 1
            let now = Int64(Date().timeIntervalSince1970 * 1e9)
            try engine.connections.run(
                """
                WITH upserted AS (
                    INSERT INTO wormhole.suite_values (grp, suite, key, value)
                    SELECT \(engine.group), \(name), k, v FROM unnest(\(setKeys)::text[], \(setValues)::text[]) AS t(k, v)
                    ON CONFLICT (grp, suite, key) DO UPDATE SET value = EXCLUDED.value RETURNING 1),
                removed AS (
                    DELETE FROM wormhole.suite_values
                    WHERE grp = \(engine.group) AND suite = \(name) AND key = ANY(\(removed)::text[]) RETURNING 1),
                change AS (
                    INSERT INTO wormhole.suite_changes
                        (grp, suite, version, keys, set_keys, set_values, sender, direction, time_ns)
                    VALUES (\(engine.group), \(name), \(version), \(keys.sorted())::text[], \(setKeys)::text[],
                        \(setValues)::text[], \(sender), \(direction), \(now)) RETURNING 1),
                trimmed AS (
                    DELETE FROM wormhole.suite_changes WHERE grp = \(engine.group) AND suite = \(name)
                        AND version <= \(version - Self.logLimit) RETURNING 1),
                bumped AS (
                    UPDATE wormhole.suites SET version = \(version) WHERE grp = \(engine.group) AND suite = \(name)
                    RETURNING 1)
                SELECT wormhole.notify(\(engine.group), '', \("nsuite." + name)) IS NULL
                """,
                on: connection,
                doing: what
            )
            return SuiteChange(
                version: UInt64(version),
                keys: keys,
                sender: sender,
                direction: direction,
                timestampNanoseconds: now,
                values: changed
            )
        }
    }

    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
        let what = "reading the changes of the suite \(name)"
        return try engine.connections.withConnection { (connection) throws(WormholeError) in
            let state = try read(on: connection, locking: false)
            guard state.version > version else { return (state, []) }
            let rows = try engine.connections.run(
                """
                SELECT version, keys, set_keys, set_values, sender, direction, time_ns FROM wormhole.suite_changes
                WHERE grp = \(engine.group) AND suite = \(name) AND version > \(Int64(clamping: version))
                    AND version <= \(Int64(clamping: state.version))
                ORDER BY version
                """,
                on: connection,
                doing: what
            )
            var changes: [SuiteChange] = []
            for row in rows {
                let (number, keys, setKeys, setValues, sender, direction, time):
                    (Int64, [String], [String], [String], String, String?, Int64)
                do {
                    (number, keys, setKeys, setValues, sender, direction, time) = try row.decode(
                        (Int64, [String], [String], [String], String, String?, Int64).self
                    )
                } catch {
                    throw WormholeError(
                        .corruptMessage,
                        "Unexpected columns while \(what): \(error).",
                        identifier: name
                    )
                }
                // A change's keys name what it set: values for keys it does not name, or two lists of different
                // lengths, were not written by this package.
                let changed = Set(keys)
                guard setKeys.count == setValues.count, setKeys.allSatisfy(changed.contains) else {
                    throw RowValues.corrupt(
                        "set_keys and set_values that do not match its keys",
                        of: "suite_changes",
                        row: "the change \(number) of the suite \(name) of group \(engine.group)",
                        identifier: name
                    )
                }
                var values = SuiteValues()
                for (key, value) in zip(setKeys, setValues) { values.setJSON(Data(value.utf8), forKey: key) }
                changes.append(
                    SuiteChange(
                        version: try RowValues.count(
                            number,
                            "version",
                            of: "suite_changes",
                            row: "a change of the suite \(name) of group \(engine.group)",
                            identifier: name
                        ),
                        keys: changed,
                        sender: sender,
                        direction: direction,
                        timestampNanoseconds: time,
                        values: values
                    )
                )
            }
            // Whole or nothing: a gap means the oldest changes were trimmed.
            guard changes.first?.version == version + 1, changes.count == Int(state.version - version) else {
                return (state, nil)
            }
            return (state, changes)
        }
    }

    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try engine.hub.observe("suite." + name, handler: handler)
    }
}
