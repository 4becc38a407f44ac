import Foundation
import GRDB
import Logging
import WormholeKit

extension SharedStore {
    /// The transactions other processes commit, from this consumer's history token on, as an `AsyncSequence`.
    ///
    /// A durable consumer (a `consumer` name) resumes where it left off, even after its process was away: its token
    /// is stored in the database, and a transaction counts as merged when the iteration asks for the next one. A
    /// consumer killed while merging a transaction gets it again. A new consumer starts at the newest transaction.
    /// With `consumer: nil`, the token lives in memory only.
    ///
    /// Observation begins when this method returns, so nothing committed after the call is missed.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name (CDShare's per-app folder), or nil for a passing one.
    ///   - tables: The tables in scope (CDShare's `sharedInScopeEntityNames`); nil for all. Transactions that
    ///     change none of them are skipped, and the others carry only their changes to these tables.
    ///   - includingOwnWrites: Whether transactions by this store's ``author`` are delivered too.
    public func remoteChanges(
        consumer: String?,
        tables: Set<String>? = nil,
        includingOwnWrites: Bool = false
    ) -> RemoteChangeSequence {
        RemoteChangeSequence(
            history: SQLiteHistory(store: self),
            consumer: consumer,
            tables: tables,
            includingOwnWrites: includingOwnWrites
        )
    }

    /// Calls `handler` with each transaction other processes commit, from this consumer's history token on.
    ///
    /// The handler runs where `execution` says, by default `CallbackExecution.automatic` (in order, on the
    /// notifier's thread while the handler returns quickly, a backlog in passes of a few milliseconds), together
    /// with the reading of the history. A transaction is acknowledged (the token moves past it) when the handler returns
    /// without throwing; when it throws, the error goes to `errorHandler` as `StoreError.Code.handlerFailed` and
    /// the same transaction is offered again at the next commit. History rows that cannot be read are reported to
    /// `errorHandler` as `StoreError.Code.corruptHistory`, and the rest of their transaction is delivered. With no
    /// `errorHandler`, errors are logged.
    ///
    /// - Returns: The observer; it stops when cancelled or released.
    public func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>? = nil,
        includingOwnWrites: Bool = false,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (StoreError) -> Void)? = nil,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws(StoreError) -> RemoteChangeObserver {
        let cursor = try ConsumerCursor(
            history: SQLiteHistory(store: self),
            name: consumer,
            tables: tables,
            includingOwnWrites: includingOwnWrites
        )
        return try RemoteChangeObserver(
            cursor: cursor,
            execution: execution,
            handler: handler,
            errorHandler: errorHandler
        )
    }

    /// Marks a transaction as merged by a durable consumer, for a consumer that stopped iterating after it.
    public func acknowledge(_ transaction: StoreTransaction, consumer: String) throws(StoreError) {
        try SQLiteHistory(store: self).storeToken(transaction.id, consumer: consumer)
    }

    /// The history token stored for a durable consumer, or nil if there is no such consumer.
    public func historyToken(forConsumer consumer: String) throws(StoreError) -> Int64? {
        try read { db in
            try Int64.fetchOne(db, sql: "SELECT token FROM wormhole_consumer WHERE name = ?", arguments: [consumer])
        }
    }
}

/// The SQLite store's history, for the remote-change consumers that WormholeKit implements once for every store.
struct SQLiteHistory: StoreHistory {
    let store: SharedStore

    var author: String { store.author }
    var location: String { store.path }
    var logger: Logger { store.logger }

    func registerConsumer(_ name: String?) throws(StoreError) -> Int64 {
        try SharedStore.takePermit("register the consumer \(name ?? "")", path: store.path)
        defer { SuspensionGate.leave() }
        do {
            return try store.databasePool.write { db in
                let head = try HistorySchema.currentToken(db)
                guard let name else { return head }
                try db.execute(
                    sql: """
                        INSERT INTO wormhole_consumer(name, token, seen_at) VALUES (?, ?, ?)
                        ON CONFLICT(name) DO UPDATE SET seen_at = excluded.seen_at
                        """,
                    arguments: [name, head, Date().timeIntervalSince1970]
                )
                return try Int64.fetchOne(
                    db,
                    sql: "SELECT token FROM wormhole_consumer WHERE name = ?",
                    arguments: [name]
                ) ?? head
            }
        } catch {
            throw SharedStore.storeError(error, "register the consumer \(name ?? "")", path: store.path)
        }
    }

    func transactions(
        after token: Int64,
        limit: Int,
        tables: Set<String>?
    ) throws(StoreError) -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        // Nothing is handed while suspended: the consumer could not store its token (a write) after handling it.
        // The observation of commits wakes the consumer when the process resumes.
        guard !SuspensionGate.isSuspended else { return ([], token) }
        do {
            // No transaction around the read: each statement of it reads a whole snapshot, and one that fetches
            // more starts over from `token`. A transaction would cost a BEGIN and a COMMIT per wake-up.
            return try store.readHistory { db in
                try HistorySchema.transactions(db, after: token, limit: limit, tables: tables)
            }
        } catch {
            throw SharedStore.storeError(error, "read the history", path: store.path)
        }
    }

    func storeToken(_ token: Int64, consumer: String) throws(StoreError) {
        try SharedStore.takePermit("store the history token of \(consumer)", path: store.path)
        defer { SuspensionGate.leave() }
        do {
            try store.databasePool.write { db in
                try db.execute(
                    sql: """
                        INSERT INTO wormhole_consumer(name, token, seen_at) VALUES (?, ?, ?)
                        ON CONFLICT(name) DO UPDATE SET token = MAX(token, excluded.token), seen_at = excluded.seen_at
                        """,
                    arguments: [consumer, token, Date().timeIntervalSince1970]
                )
            }
        } catch {
            throw SharedStore.storeError(error, "store the history token of \(consumer)", path: store.path)
        }
    }

    func observeCommits(_ handler: @escaping @Sendable () -> Void) throws(StoreError) -> NotifierObservation {
        do {
            let commits = try store.notifier.observe(store.notificationName, handler: handler)
            // What other processes committed while this one was suspended is read when it resumes.
            let resumptions = SuspensionGate.observe { suspended in if !suspended { handler() } }
            return NotifierObservation {
                commits.cancel()
                resumptions.cancel()
            }
        } catch {
            throw StoreError(
                .notification,
                "Could not observe commits: \(error.message)",
                path: store.path,
                underlyingError: error
            )
        }
    }

    func purgeIfDue() { store.purgeIfDue() }
}
