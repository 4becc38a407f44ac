import Foundation
import Logging
import PostgresNIO
import WormholeKit

/// A PostgreSQL store's history, for the remote-change consumers that WormholeKit implements once for every store.
struct PostgresStoreHistory: StoreHistory {
    let store: PostgresStore

    var author: String { store.author }
    var location: String { store.location }
    var logger: Logger { store.logger }

    func registerConsumer(_ name: String?) throws(StoreError) -> Int64 {
        let (group, storeName) = (store.group, store.name)
        return try store.withConnection(doing: "register the consumer \(name ?? "")") {
            (connection) throws(StoreError) in
            let rows: [PostgresRow]
            if let name {
                // A new consumer starts at the newest committed transaction; one that exists keeps its token.
                rows = try connection.run(
                    """
                    INSERT INTO wormhole.store_consumers AS c (grp, store, consumer, token)
                    SELECT \(group), \(storeName), \(name), s.last_id FROM wormhole.stores s
                    WHERE s.grp = \(group) AND s.store = \(storeName)
                    ON CONFLICT (grp, store, consumer) DO UPDATE SET seen = now()
                    RETURNING c.token
                    """
                )
            } else {
                rows = try connection.run(
                    "SELECT last_id FROM wormhole.stores WHERE grp = \(group) AND store = \(storeName)"
                )
            }
            return try PostgresStore.decode(Int64.self, rows.first, "the store's history token")
        }
    }

    /// The most change rows one statement of a read returns: a transaction with more is read in pages of this
    /// many, so that no statement of a read grows with the size of the transactions it reads.
    static let changesPerRead: Int64 = 10_000

    func transactions(
        after token: Int64,
        limit: Int,
        tables: Set<String>?
    ) throws(StoreError) -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        let (group, storeName) = (store.group, store.name)
        // Sorted, so that the statement's text and so its plan do not depend on a set's order.
        let followed = tables.map { Array($0).sorted() }
        let pageSize = Self.changesPerRead
        var transactions: [StoreTransaction] = []
        var scanned = token
        var rowsRead: Int64 = 0
        var lastSequence: Int64 = 0
        try store.withConnection(doing: "read the history") { (connection) throws(StoreError) in
            // Ids are given at commit, in commit order, under a lock kept until the commit ends: every id up to the
            // newest one visible has committed, so reading by id never skips a transaction that commits later.
            let rows = try connection.run(
                """
                SELECT * FROM wormhole.store_read_bounded(\(group), \(storeName), \(token), \(Int64(limit)), \
                \(pageSize), \(followed))
                """
            )
            rowsRead = Int64(rows.count)
            for row in rows {
                let (id, author, time, table, operation, key, sequence) = try decode(row) {
                    try $0.decode((Int64, String, Double, String, String, String, Int64).self)
                }
                // In id order; a transaction's rows one after another.
                guard id > scanned || (id == scanned && transactions.last?.id == id) else {
                    throw Self.unexpected("transaction \(id) after \(scanned)", location)
                }
                scanned = id
                if transactions.last?.id != id {
                    transactions.append(
                        StoreTransaction(id: id, author: author, date: Date(timeIntervalSince1970: time), tables: [:])
                    )
                }
                lastSequence = sequence
                guard !table.isEmpty else { continue }
                Self.add(table, operation, key, sequence, to: &transactions[transactions.count - 1])
            }
            // A full page may have cut the last transaction: the rest of its changes, a page at a time.
            while rowsRead == pageSize, let last = transactions.last {
                let rows = try connection.run(
                    """
                    SELECT * FROM wormhole.store_read_changes(\(group), \(storeName), \(last.id), \(lastSequence), \
                    \(pageSize), \(followed))
                    """
                )
                rowsRead = Int64(rows.count)
                for row in rows {
                    let (table, operation, key, sequence) = try decode(row) {
                        try $0.decode((String, String, String, Int64).self)
                    }
                    guard sequence > lastSequence else {
                        throw Self.unexpected("change \(sequence) after \(lastSequence)", location)
                    }
                    lastSequence = sequence
                    Self.add(table, operation, key, sequence, to: &transactions[transactions.count - 1])
                }
            }
        }
        guard let tables else { return (transactions, scanned) }
        let inScope = transactions.compactMap { transaction -> StoreTransaction? in
            var kept = transaction
            kept.tables = transaction.tables.filter { tables.contains($0.key) }
            kept.damagedChanges = transaction.damagedChanges.filter { tables.contains($0.table) }
            return kept.tables.isEmpty && kept.damagedChanges.isEmpty ? nil : kept
        }
        return (inScope, scanned)
    }

    /// A row of the history decoded by `body`, or the error that says it is not one.
    private func decode<Value>(
        _ row: PostgresRow,
        _ body: (PostgresRow) throws -> Value
    ) throws(StoreError) -> Value {
        do { return try body(row) } catch {
            throw StoreError(
                .database,
                "PostgreSQL returned an unexpected row while reading the history: \(error).",
                path: location,
                underlyingError: SendableDescription(error)
            )
        }
    }

    /// The error for history rows out of order (written by hand).
    private static func unexpected(_ what: String, _ location: String) -> StoreError {
        StoreError(
            .database,
            "PostgreSQL returned the history out of order (\(what)): wormhole.store_transactions or store_changes holds "
                + "rows no writer of this package writes.",
            path: location
        )
    }

    /// Adds one recorded row change to `transaction`; one that cannot be read becomes a damaged change.
    private static func add(
        _ table: String,
        _ operation: String,
        _ key: String,
        _ sequence: Int64,
        to transaction: inout StoreTransaction
    ) {
        guard let primaryKey = PrimaryKey(historyJSON: key) else {
            transaction.damagedChanges.append(
                DamagedChange(changeID: sequence, table: table, reason: "its primary key \(key) is not readable")
            )
            return
        }
        switch operation {
        case "i": transaction.tables[table, default: TableChanges()].inserted.append(primaryKey)
        case "u": transaction.tables[table, default: TableChanges()].updated.append(primaryKey)
        case "d": transaction.tables[table, default: TableChanges()].deleted.append(primaryKey)
        default:
            transaction.damagedChanges.append(
                DamagedChange(changeID: sequence, table: table, reason: "its operation \(operation) is unknown")
            )
        }
    }

    func storeToken(_ token: Int64, consumer: String) throws(StoreError) {
        let (group, storeName) = (store.group, store.name)
        _ = try store.withConnection(doing: "store the history token of \(consumer)") {
            (connection) throws(StoreError) in
            try connection.run(
                """
                INSERT INTO wormhole.store_consumers AS c (grp, store, consumer, token)
                VALUES (\(group), \(storeName), \(consumer), \(token))
                ON CONFLICT (grp, store, consumer) DO UPDATE SET token = greatest(c.token, excluded.token), seen = now()
                """
            )
        }
    }

    func observeCommits(_ handler: @escaping @Sendable () -> Void) throws(StoreError) -> NotifierObservation {
        do {
            return try store.engine.core.hub.observe("store." + store.name, handler: handler)
        } catch {
            throw StoreError(
                .notification,
                "Could not observe commits: \(error.message)",
                path: location,
                underlyingError: error
            )
        }
    }

    func purgeIfDue() { store.purgeIfDue() }
}
