import Foundation
import GRDB
import WormholeKit

/// The table and triggers that record a store's history.
///
/// History is recorded by SQLite triggers on every tracked table, not by a GRDB transaction observer, so that writes
/// made by other tools (the `sqlite3` shell, another library) are recorded too, with their real primary keys.
///
/// It is one append-only log, `wormhole_history`: a trigger appends a *change* row (operation, table, primary key as
/// JSON); a write through ``SharedStore`` ends by appending a *commit* row (author, time) that closes the changes
/// before it into one transaction, whose id is the commit row's id: the history token. One table, appended to at its
/// end, keeps the extra pages a commit writes to a minimum. Changes left by other tools, with no commit row after
/// them, are closed by the next store write, first, as a transaction of author `external`. Row ids are never reused:
/// purging always keeps the newest row.
enum HistorySchema {
    static let externalAuthor = "external"
    static let commitOperation = "commit"

    static func create(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS wormhole_history (
                    id INTEGER PRIMARY KEY,
                    operation TEXT NOT NULL,
                    table_name TEXT,
                    primary_key TEXT,
                    author TEXT,
                    timestamp REAL
                );
                CREATE TABLE IF NOT EXISTS wormhole_consumer (
                    name TEXT PRIMARY KEY,
                    token INTEGER NOT NULL,
                    seen_at REAL NOT NULL
                );
                """
        )
    }

    /// Whether a table belongs to SQLite, GRDB or the store itself, and is never tracked.
    static func isInternal(_ table: String) -> Bool {
        let lowered = table.lowercased()
        return lowered.hasPrefix("sqlite_") || lowered.hasPrefix("wormhole_") || lowered.hasPrefix("grdb_")
    }

    /// Creates the missing triggers of every tracked table, and drops every other trigger of the history: those of
    /// untracked tables, and those a table took with it when it was renamed (their bodies name the old table).
    ///
    /// A trigger whose text is not the one this version makes is made again, so that a store opened by a newer
    /// version records what the newer version records.
    static func installTriggers(_ db: Database, untracked: Set<String>) throws {
        var wanted: [String: (table: String, sql: String)] = [:]
        for table in try trackableTables(db) where !isInternal(table) && !untracked.contains(table) {
            for (operation, sql) in try triggers(db, table: table) {
                wanted[triggerName(table, operation)] = (table, sql)
            }
        }
        let existing = try Row.fetchAll(
            db,
            sql:
                "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'wormhole_history_%'"
        )
        var kept = Set<String>()
        for row in existing {
            let name: String = row["name"]
            if let want = wanted[name], want.table == row["tbl_name"], want.sql == row["sql"] {
                kept.insert(name)
            } else {
                try db.execute(sql: "DROP TRIGGER IF EXISTS \(quoted(name))")
            }
        }
        for (name, want) in wanted where !kept.contains(name) { try db.execute(sql: want.sql) }
    }

    /// The tables whose changes can be recorded: ordinary tables, not virtual ones (on which SQLite refuses
    /// triggers) nor the shadow tables that hold a virtual table's data.
    private static func trackableTables(_ db: Database) throws -> [String] {
        do {
            return try String.fetchAll(
                db,
                sql: "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table'"
            )
        } catch {
            // SQLite before 3.37 has no table_list: virtual tables are told by their statement; their shadow tables
            // are then recorded too, which costs history rows and loses nothing.
            return try String.fetchAll(
                db,
                sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL TABLE%'"
            )
        }
    }

    /// The statements that make the three triggers of `table`, by operation.
    ///
    /// An update that changes a row's primary key is recorded as the old key deleted and the new one inserted, as
    /// PostgreSQL's store records it, so that a consumer that merges by key drops the old row.
    private static func triggers(_ db: Database, table: String) throws -> [(String, String)] {
        let columns = try db.primaryKey(table).columns
        func key(_ row: String) -> String {
            columns.map { (column: String) -> String in
                // json_object refuses BLOBs: record them as hexadecimal text, so that no write ever fails here.
                let value = "\(row).\(quoted(column))"
                return "\(literal(column)), CASE typeof(\(value)) WHEN 'blob' THEN hex(\(value)) ELSE \(value) END"
            }.joined(separator: ", ")
        }
        let keyChanged = columns.map { "OLD.\(quoted($0)) IS NOT NEW.\(quoted($0))" }.joined(separator: " OR ")
        func trigger(_ operation: String, _ event: String, body: String) -> (String, String) {
            (
                operation,
                """
                CREATE TRIGGER \(quoted(triggerName(table, operation))) AFTER \(event) ON \(quoted(table)) BEGIN
                \(body)
                END
                """
            )
        }
        let insert = "INSERT INTO wormhole_history(operation, table_name, primary_key)"
        return [
            trigger(
                "insert",
                "INSERT",
                body: "\(insert) VALUES ('insert', \(literal(table)), json_object(\(key("NEW"))));"
            ),
            trigger(
                "update",
                "UPDATE",
                body: """
                    \(insert) SELECT 'delete', \(literal(table)), json_object(\(key("OLD"))) WHERE \(keyChanged);
                    \(insert) SELECT CASE WHEN \(keyChanged) THEN 'insert' ELSE 'update' END, \(literal(table)),
                        json_object(\(key("NEW")));
                    """
            ),
            trigger(
                "delete",
                "DELETE",
                body: "\(insert) VALUES ('delete', \(literal(table)), json_object(\(key("OLD"))));"
            ),
        ]
    }

    static func triggerName(_ table: String, _ operation: String) -> String { "wormhole_history_\(table)_\(operation)" }

    /// An SQL identifier in double quotes.
    static func quoted(_ identifier: String) -> String {
        "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    /// An SQL string literal.
    static func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }

    /// The id of the last history row, after closing changes that other tools left into an `external` transaction;
    /// and whether there were such changes (their transaction must be announced even if this write records nothing).
    static func beginWrite(_ db: Database) throws -> (last: Int64, closedExternal: Bool) {
        // Cached statements: these run in every write, and compiling them would cost more than running them.
        guard
            let last = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT id, operation FROM wormhole_history ORDER BY id DESC LIMIT 1")
            )
        else { return (0, false) }
        let operation: String = last["operation"]
        if operation == commitOperation { return (last["id"], false) }
        return (try appendCommit(db, author: externalAuthor), true)
    }

    /// Closes the changes appended since `lastID` into a transaction of `author`; returns its token, or nil when the
    /// write changed nothing that is tracked.
    static func endWrite(_ db: Database, since lastID: Int64, author: String) throws -> Int64? {
        // The commit row only if the triggers appended changes since the write began. Two statements, not one
        // `INSERT … SELECT … WHERE (SELECT MAX(id) …) > ?`: an insert whose source reads its own table goes through a
        // temporary table, which cost 5–7 µs of a write's 33–48 µs (`bench store`).
        let newest = try Int64.fetchOne(db.cachedStatement(sql: "SELECT MAX(id) FROM wormhole_history")) ?? 0
        guard newest > lastID else { return nil }
        return try appendCommit(db, author: author)
    }

    private static func appendCommit(_ db: Database, author: String) throws -> Int64 {
        try db.cachedStatement(
            sql: "INSERT INTO wormhole_history(operation, author, timestamp) VALUES ('commit', ?, ?)"
        ).execute(arguments: [author, Date().timeIntervalSince1970])
        return db.lastInsertedRowID
    }

    /// The id of the last commit row stamped before `time` (seconds since 1970), or 0.
    ///
    /// Commit times rise with ids: the processes of one host stamp their commits with its clock, under the database's
    /// write lock. So the first commit stamped at `time` or later is found by bisecting ids, about 2·log2(n) short
    /// reads, where `SELECT MAX(id) … WHERE timestamp < ?` read every row newer than `time` (about 100 ms with a million
    /// transactions kept for a consumer that is away, once a second in each consuming process). If the clock was set
    /// back, the times do not rise everywhere, and the answer is the commit before one of the places where they cross
    /// `time`.
    static func lastCommit(_ db: Database, before time: Double) throws -> Int64 {
        let firstCommit = try db.cachedStatement(
            sql: "SELECT id, timestamp FROM wormhole_history WHERE id >= ? AND operation = 'commit' ORDER BY id LIMIT 1"
        )
        // Whether the first commit from `id` on, if any, was stamped before `time`; and its id.
        func oldCommit(from id: Int64) throws -> Int64? {
            guard let row = try Row.fetchOne(firstCommit, arguments: [id]) else { return nil }
            // A commit row without a time (not the store's) counts as recent: it is never purged for its age.
            guard let stamp: Double = row[1], stamp < time else { return nil }
            return row[0]
        }
        guard let newest = try Int64.fetchOne(db, sql: "SELECT MAX(id) FROM wormhole_history") else { return 0 }
        var low = try Int64.fetchOne(db, sql: "SELECT MIN(id) FROM wormhole_history") ?? 0
        var high = newest + 1
        // Commits below `low` are older than `time`; the first commit from `high` on, if any, is not.
        while low < high {
            let middle = low + (high - low) / 2
            if let old = try oldCommit(from: middle) { low = old + 1 } else { high = middle }
        }
        return try Int64.fetchOne(
            db,
            sql: "SELECT MAX(id) FROM wormhole_history WHERE operation = 'commit' AND id < ?",
            arguments: [low]
        ) ?? 0
    }

    /// The newest history token: the id of the last commit row, or 0.
    static func currentToken(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(
            db.cachedStatement(
                sql: "SELECT id FROM wormhole_history WHERE operation = 'commit' ORDER BY id DESC LIMIT 1"
            )
        ) ?? 0
    }

    /// The transactions after `token`, at most about `limit` of them, keeping only changes to `tables` (all when
    /// nil).
    ///
    /// Returns the transactions that touch the tables, and the token of the last transaction looked at, so that a
    /// consumer can move past transactions that do not concern it.
    static func transactions(
        _ db: Database,
        after token: Int64,
        limit: Int,
        tables: Set<String>?
    ) throws -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        var rowLimit = max(limit, 1) * 16
        while true {
            // Columns by position, rows read where SQLite returns them (a cursor): no lookup by name, no copy.
            let rows = try Row.fetchCursor(
                db.cachedStatement(
                    sql: """
                        SELECT id, operation, table_name, primary_key, author, timestamp FROM wormhole_history
                        WHERE id > ? ORDER BY id LIMIT ?
                        """
                ),
                arguments: [token, rowLimit]
            )
            var fetched = 0
            var result: [StoreTransaction] = []
            var scanned = token
            var pending = StoreTransaction(id: 0, author: "", date: Date(timeIntervalSince1970: 0), tables: [:])
            while let row = try rows.next() {
                fetched += 1
                let id: Int64 = row[0]
                let operation: String? = row[1]
                if operation == commitOperation {
                    pending.id = id
                    pending.author = row[4] ?? "unknown"
                    pending.date = Date(timeIntervalSince1970: row[5] ?? 0)
                    if !pending.tables.isEmpty || !pending.damagedChanges.isEmpty { result.append(pending) }
                    pending = StoreTransaction(id: 0, author: "", date: Date(timeIntervalSince1970: 0), tables: [:])
                    scanned = id
                    if result.count >= limit { return (result, scanned) }
                    continue
                }
                let table: String = row[2] ?? "?"
                if let tables, !tables.contains(table) { continue }
                switch (operation, decodeKey(row[3])) {
                case ("insert", .success(let key)): pending.tables[table, default: TableChanges()].inserted.append(key)
                case ("update", .success(let key)): pending.tables[table, default: TableChanges()].updated.append(key)
                case ("delete", .success(let key)): pending.tables[table, default: TableChanges()].deleted.append(key)
                case (_, .failure(let reason)):
                    pending.damagedChanges.append(DamagedChange(changeID: id, table: table, reason: reason.text))
                case (let operation, .success):
                    pending.damagedChanges.append(
                        DamagedChange(changeID: id, table: table, reason: "unknown operation \(operation ?? "NULL")")
                    )
                }
            }
            // Rows after the last commit row belong to a transaction still open to this reader: one of more rows
            // than fetched, or changes by another tool not yet closed. Fetch more only in the first case.
            if scanned == token, fetched == rowLimit {
                rowLimit *= 4
                continue
            }
            return (result, scanned)
        }
    }

    private struct Reason: Error { var text: String }

    private static func decodeKey(_ text: String?) -> Result<PrimaryKey, Reason> {
        guard let text else { return .failure(Reason(text: "no primary key")) }
        guard let key = PrimaryKey(historyJSON: text) else {
            return .failure(Reason(text: "the primary key is not a JSON object of values: \(text.prefix(80))"))
        }
        return .success(key)
    }
}
