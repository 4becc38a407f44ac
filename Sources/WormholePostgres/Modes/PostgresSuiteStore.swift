import Foundation
import PostgresNIO
import WormholeKit

/// A suite in `wormhole.suites` (its version), `wormhole.suite_values` (one row per key, the value's JSON text as
/// written) and `wormhole.suite_changes` (the last ``logLimit`` changes, for observers that catch up).
///
/// An update is optimistic: it reads the values and their version without a lock, runs the caller's closure, then
/// writes, in one statement, only if the version is still the one it read (else it reads and runs the closure again).
/// So no lock is held while the caller's code runs, and a process stopped in its closure holds nobody up; updates
/// from every host still come one after the other, each seeing the one before, and write only the keys that changed.
final class PostgresSuiteStore: SuiteStore {
    let engine: PostgresCore
    let name: String
    /// How many changes are kept, as a directory suite keeps 64.
    static let logLimit: Int64 = 64
    /// How many times an update runs its closure again, another update having come in between, before it fails.
    static let updateAttempts = 100

    init(engine: PostgresCore, name: String) {
        self.engine = engine
        self.name = name
    }

    func read() throws(WormholeError) -> SuiteState {
        try engine.connections.withConnection { (connection) throws(WormholeError) in
            try read(on: connection)
        }
    }

    private func read(on connection: PostgresConnection) throws(WormholeError) -> SuiteState {
        let what = "reading the suite \(name)"
        var values = SuiteValues()
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
        for _ in 0..<Self.updateAttempts {
            let current = try read()
            var values = current.values
            try body(&values)
            switch try write(values, over: current, sender: sender, direction: direction) {
            case .unchanged: return nil
            case .changed(let change): return change
            case .overtaken: continue
            }
        }
        throw WormholeError(
            .timedOut,
            "The suite \(name) changed under this update \(Self.updateAttempts) times in a row: other processes update "
                + "it without pause. Nothing was changed; try again.",
            identifier: name
        )
    }

    /// What an optimistic write did.
    private enum Written {
        /// `body` changed nothing: nothing was written.
        case unchanged
        case changed(SuiteChange)
        /// Another update came in between: nothing was written, and the closure runs again.
        case overtaken
    }

    /// Writes what `values` changes of `current`, if the suite is still at `current`'s version.
    private func write(
        _ values: SuiteValues,
        over current: SuiteState,
        sender: String,
        direction: String?
    ) throws(WormholeError) -> Written {
        let keys = Set(values.keys).union(current.values.keys).filter {
            values.json(forKey: $0) != current.values.json(forKey: $0)
        }
        guard !keys.isEmpty else { return .unchanged }
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
        let old = Int64(current.version)
        let version = old + 1
        let now = Int64(Date().timeIntervalSince1970 * 1e9)
        // One statement: the version moves from the one read (or the row is made, for a suite's first change) and
        // everything else happens only then. Another update that came in between leaves `bumped` empty; one at work
        // meanwhile holds the row until its commit, after which the version is no longer `old`.
        let rows = try engine.connections.query(
            """
            WITH bumped AS (
                INSERT INTO wormhole.suites AS s (grp, suite, version) VALUES (\(engine.group), \(name), \(version))
                ON CONFLICT (grp, suite) DO UPDATE SET version = EXCLUDED.version WHERE s.version = \(old)
                RETURNING 1),
            upserted AS (
                INSERT INTO wormhole.suite_values (grp, suite, key, value)
                SELECT \(engine.group), \(name), k, v FROM unnest(\(setKeys)::text[], \(setValues)::text[]) AS t(k, v)
                WHERE EXISTS (SELECT 1 FROM bumped)
                ON CONFLICT (grp, suite, key) DO UPDATE SET value = EXCLUDED.value RETURNING 1),
            removed AS (
                DELETE FROM wormhole.suite_values
                WHERE grp = \(engine.group) AND suite = \(name) AND key = ANY(\(removed)::text[])
                    AND EXISTS (SELECT 1 FROM bumped) RETURNING 1),
            change AS (
                INSERT INTO wormhole.suite_changes
                    (grp, suite, version, keys, set_keys, set_values, sender, direction, time_ns)
                SELECT \(engine.group), \(name), \(version), \(keys.sorted())::text[], \(setKeys)::text[],
                    \(setValues)::text[], \(sender), \(direction), \(now)
                WHERE EXISTS (SELECT 1 FROM bumped) RETURNING 1),
            trimmed AS (
                DELETE FROM wormhole.suite_changes WHERE grp = \(engine.group) AND suite = \(name)
                    AND version <= \(version - Self.logLimit) AND EXISTS (SELECT 1 FROM bumped) RETURNING 1)
            SELECT EXISTS (SELECT 1 FROM bumped),
                CASE WHEN EXISTS (SELECT 1 FROM bumped) THEN wormhole.notify(\(engine.group), '', \("nsuite." + name)) END
                    IS NULL
            """,
            doing: "updating the suite \(name)"
        )
        guard try decode(Bool.self, rows.first, doing: "updating the suite \(name)") else { return .overtaken }
        return .changed(
            SuiteChange(
                version: UInt64(version),
                keys: keys,
                sender: sender,
                direction: direction,
                timestampNanoseconds: now,
                values: changed
            )
        )
    }

    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
        let what = "reading the changes of the suite \(name)"
        return try engine.connections.withConnection { (connection) throws(WormholeError) in
            let state = try read(on: connection)
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
