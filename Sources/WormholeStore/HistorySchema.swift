import Foundation
import GRDB

/// The tables and triggers that record a store's history.
///
/// History is recorded by SQLite triggers on every tracked table, not by a GRDB transaction observer, so that writes
/// made by other tools (the `sqlite3` shell, another library) are recorded too, with their real primary keys. A
/// trigger appends a row to `wormhole_change` with no transaction; a write through ``SharedStore`` ends by creating
/// its `wormhole_transaction` row (author, time) and claiming its unclaimed changes. Changes that other tools left
/// are claimed by the next store write, first, as one transaction of author `external`.
enum HistorySchema {
    static let externalAuthor = "external"

    static func create(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS wormhole_transaction (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    author TEXT NOT NULL,
                    timestamp REAL NOT NULL
                );
                CREATE TABLE IF NOT EXISTS wormhole_change (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    transaction_id INTEGER,
                    table_name TEXT NOT NULL,
                    operation TEXT NOT NULL,
                    primary_key TEXT NOT NULL
                );
                CREATE INDEX IF NOT EXISTS wormhole_change_by_transaction ON wormhole_change(transaction_id);
                CREATE TABLE IF NOT EXISTS wormhole_consumer (
                    name TEXT PRIMARY KEY,
                    token INTEGER NOT NULL,
                    seen_at REAL NOT NULL
                );
                """)
    }

    /// Whether a table belongs to SQLite, GRDB or the store itself, and is never tracked.
    static func isInternal(_ table: String) -> Bool {
        let lowered = table.lowercased()
        return lowered.hasPrefix("sqlite_") || lowered.hasPrefix("wormhole_") || lowered.hasPrefix("grdb_")
    }

    /// Creates the missing triggers of every tracked table, and drops those of untracked ones.
    static func installTriggers(_ db: Database, untracked: Set<String>) throws {
        let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table'")
        for table in tables where !isInternal(table) {
            if untracked.contains(table) {
                for operation in ["insert", "update", "delete"] {
                    let drop: String = "DROP TRIGGER IF EXISTS \(quoted(triggerName(table, operation)))"
                    try db.execute(sql: drop)
                }
                continue
            }
            let columns = try db.primaryKey(table).columns
            for (operation, event, row) in [("insert", "INSERT", "NEW"), ("update", "UPDATE", "NEW"), ("delete", "DELETE", "OLD")] {
                let key: String = columns.map { (column: String) -> String in
                    // json_object refuses BLOBs: record them as hexadecimal text, so that no write ever fails here.
                    let value = "\(row).\(quoted(column))"
                    return "\(literal(column)), CASE typeof(\(value)) WHEN 'blob' THEN hex(\(value)) ELSE \(value) END"
                }.joined(separator: ", ")
                let trigger: String = """
                        CREATE TRIGGER IF NOT EXISTS \(quoted(triggerName(table, operation)))
                        AFTER \(event) ON \(quoted(table)) BEGIN
                            INSERT INTO wormhole_change(table_name, operation, primary_key)
                            VALUES (\(literal(table)), '\(operation)', json_object(\(key)));
                        END
                        """
                try db.execute(sql: trigger)
            }
        }
    }

    static func triggerName(_ table: String, _ operation: String) -> String { "wormhole_history_\(table)_\(operation)" }

    /// An SQL identifier in double quotes.
    static func quoted(_ identifier: String) -> String { "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }

    /// An SQL string literal.
    static func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }

    /// Gathers the changes no transaction has claimed into a new transaction of `author`; returns its id, or nil
    /// when there were none.
    static func claimUnclaimedChanges(_ db: Database, author: String) throws -> Int64? {
        let pending = try Int64.fetchOne(
            db, sql: "SELECT id FROM wormhole_change WHERE transaction_id IS NULL LIMIT 1")
        guard pending != nil else { return nil }
        try db.cachedStatement(sql: "INSERT INTO wormhole_transaction(author, timestamp) VALUES (?, ?)")
            .execute(arguments: [author, Date().timeIntervalSince1970])
        let transaction = db.lastInsertedRowID
        try db.cachedStatement(sql: "UPDATE wormhole_change SET transaction_id = ? WHERE transaction_id IS NULL")
            .execute(arguments: [transaction])
        return transaction
    }

    /// The transactions after `token`, at most `limit` of them, keeping only changes to `tables` (all when nil).
    ///
    /// Returns the transactions that touch the tables, and the id of the last transaction looked at, so that a
    /// consumer can move past transactions that do not concern it.
    static func transactions(
        _ db: Database, after token: Int64, limit: Int, tables: Set<String>?
    ) throws -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        let rows = try Row.fetchAll(
            db,
            sql: """
                SELECT t.id, t.author, t.timestamp, c.id AS change_id, c.table_name, c.operation, c.primary_key
                FROM (SELECT * FROM wormhole_transaction WHERE id > ? ORDER BY id LIMIT ?) AS t
                LEFT JOIN wormhole_change AS c ON c.transaction_id = t.id
                ORDER BY t.id, c.id
                """,
            arguments: [token, limit])
        var result: [StoreTransaction] = []
        var scanned = token
        var current: StoreTransaction?
        func flush() {
            if let transaction = current, !transaction.tables.isEmpty || !transaction.damagedChanges.isEmpty {
                result.append(transaction)
            }
        }
        for row in rows {
            let id: Int64 = row["id"]
            if current?.id != id {
                flush()
                scanned = id
                current = StoreTransaction(
                    id: id, author: row["author"], date: Date(timeIntervalSince1970: row["timestamp"]), tables: [:])
            }
            guard let changeID: Int64 = row["change_id"] else { continue }
            let table: String = row["table_name"]
            if let tables, !tables.contains(table) { continue }
            let operation: String? = row["operation"]
            let keyText: String? = row["primary_key"]
            switch decodeKey(keyText) {
            case .success(let key):
                switch operation {
                case "insert": current!.tables[table, default: TableChanges()].inserted.append(key)
                case "update": current!.tables[table, default: TableChanges()].updated.append(key)
                case "delete": current!.tables[table, default: TableChanges()].deleted.append(key)
                default:
                    current!.damagedChanges.append(
                        DamagedChange(changeID: changeID, table: table, reason: "unknown operation \(operation ?? "NULL")"))
                }
            case .failure(let reason):
                current!.damagedChanges.append(DamagedChange(changeID: changeID, table: table, reason: reason.text))
            }
        }
        flush()
        return (result, scanned)
    }

    private struct Reason: Error { var text: String }

    private static func decodeKey(_ text: String?) -> Result<PrimaryKey, Reason> {
        guard let text else { return .failure(Reason(text: "no primary key")) }
        do {
            return .success(PrimaryKey(try JSONDecoder().decode([String: PrimaryKeyValue].self, from: Data(text.utf8))))
        } catch {
            return .failure(Reason(text: "the primary key is not a JSON object of values: \(text.prefix(80))"))
        }
    }
}
