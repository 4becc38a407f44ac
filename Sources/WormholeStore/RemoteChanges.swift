import Foundation
import GRDB
import Synchronization
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
        RemoteChangeSequence(store: self, consumer: consumer, tables: tables, includingOwnWrites: includingOwnWrites)
    }

    /// Calls `handler` with each transaction other processes commit, from this consumer's history token on.
    ///
    /// The handler runs where `execution` says, a serial queue of the observer's own by default, together with the
    /// reading of the history. A transaction is acknowledged (the token moves past it) when the handler returns
    /// without throwing; when it throws, the error goes to `errorHandler` as ``StoreError/Code/handlerFailed`` and
    /// the same transaction is offered again at the next commit. History rows that cannot be read are reported to
    /// `errorHandler` as ``StoreError/Code/corruptHistory``, and the rest of their transaction is delivered. With no
    /// `errorHandler`, errors are logged.
    ///
    /// - Returns: The observer; it stops when cancelled or released.
    public func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>? = nil,
        includingOwnWrites: Bool = false,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (StoreError) -> Void)? = nil,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws(StoreError) -> RemoteChangeObserver {
        let cursor = try ConsumerCursor(
            store: self,
            name: consumer,
            tables: tables,
            includingOwnWrites: includingOwnWrites
        )
        let observer = RemoteChangeObserver(
            cursor: cursor,
            execution: execution,
            handler: handler,
            errorHandler: errorHandler
        )
        do {
            let observation = try notifier.observe(notificationName) { [weak observer] in observer?.wake() }
            observer.start(observation)
        } catch {
            throw StoreError(
                .notification,
                "Could not observe commits: \(error.message)",
                path: path,
                underlyingError: error
            )
        }
        return observer
    }

    /// Marks a transaction as merged by a durable consumer, for a consumer that stopped iterating after it.
    public func acknowledge(_ transaction: StoreTransaction, consumer: String) throws(StoreError) {
        do {
            try databasePool.write { db in
                try ConsumerCursor.store(token: transaction.id, consumer: consumer, db)
            }
        } catch {
            throw Self.storeError(error, "store the history token of \(consumer)", path: path)
        }
    }

    /// The history token stored for a durable consumer, or nil if there is no such consumer.
    public func historyToken(forConsumer consumer: String) throws(StoreError) -> Int64? {
        try read { db in
            try Int64.fetchOne(db, sql: "SELECT token FROM wormhole_consumer WHERE name = ?", arguments: [consumer])
        }
    }
}

/// A consumer's place in the history.
final class ConsumerCursor: Sendable {
    let store: SharedStore
    let name: String?
    let tables: Set<String>?
    let includingOwnWrites: Bool
    private let token: Locked<Int64>

    init(store: SharedStore, name: String?, tables: Set<String>?, includingOwnWrites: Bool) throws(StoreError) {
        self.store = store
        self.name = name
        self.tables = tables
        self.includingOwnWrites = includingOwnWrites
        do {
            let start: Int64 = try store.databasePool.write { db in
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
            token = Locked(start)
        } catch {
            throw SharedStore.storeError(error, "register the consumer \(name ?? "")", path: store.path)
        }
    }

    var current: Int64 { token.withLock { $0 } }

    /// The next transactions for this consumer, and how far the history was looked at.
    func fetch(_ db: Database, limit: Int = 100) throws -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        let (batch, scanned) = try HistorySchema.transactions(db, after: current, limit: limit, tables: tables)
        let mine = includingOwnWrites ? batch : batch.filter { $0.author != store.author }
        return (mine, scanned)
    }

    /// Moves the token to `id`, in memory and (for a durable consumer) in the database.
    func acknowledge(through id: Int64, _ db: Database) throws {
        if let name { try Self.store(token: id, consumer: name, db) }
        token.withLock { $0 = max($0, id) }
    }

    static func store(token: Int64, consumer: String, _ db: Database) throws {
        try db.execute(
            sql: "UPDATE wormhole_consumer SET token = MAX(token, ?), seen_at = ? WHERE name = ?",
            arguments: [token, Date().timeIntervalSince1970, consumer]
        )
    }
}

/// A running observation of remote changes; it stops when cancelled or released.
public final class RemoteChangeObserver: WormholeCancellable {
    private let cursor: ConsumerCursor
    private let handler: @Sendable (StoreTransaction) throws -> Void
    private let errorHandler: (@Sendable (StoreError) -> Void)?
    private let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
    /// Held while delivering, so that `cancel()` can wait for a delivery under way.
    private let delivering = Locked(())
    /// The thread delivering right now, so that `cancel()` called from a handler does not wait for itself.
    private let deliveringThread = Atomic<UInt>(0)
    private let scheduled = Atomic<Bool>(false)
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)

    init(
        cursor: ConsumerCursor,
        execution: CallbackExecution,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void,
        errorHandler: (@Sendable (StoreError) -> Void)?
    ) {
        self.cursor = cursor
        self.handler = handler
        self.errorHandler = errorHandler
        self.schedule = execution.makeScheduler(label: "wormhole.store.observer")
    }

    func start(_ observation: NotifierObservation) {
        self.observation.withLock { $0 = observation }
        wake()  // catch up on what was committed while this consumer was away
    }

    func wake() {
        // Coalesce: one pass reads everything committed so far.
        guard !scheduled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        schedule { [self] in
            scheduled.store(false, ordering: .releasing)
            delivering.withLock { _ in
                deliveringThread.store(UInt(bitPattern: Int(bitPattern: pthread_self())), ordering: .releasing)
                defer { deliveringThread.store(0, ordering: .releasing) }
                deliverPending()
            }
        }
    }

    /// Whether the observer has stopped.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    /// The consumer's history token.
    public var historyToken: Int64 { cursor.current }

    /// Stops the observer. A transaction being handled finishes first, and is acknowledged if its handler returns:
    /// when `cancel()` returns (from outside a handler), nothing is left handled but unacknowledged.
    public func cancel() {
        cancelled.store(true, ordering: .relaxed)
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        // Wait for a delivery under way, unless this is that delivery's own thread.
        if deliveringThread.load(ordering: .acquiring) != UInt(bitPattern: Int(bitPattern: pthread_self())) {
            delivering.withLock { _ in }
        }
    }

    deinit { cancel() }

    private func deliverPending() {
        let pool = cursor.store.databasePool
        while !cancelled.load(ordering: .relaxed) {
            let batch: [StoreTransaction]
            let scanned: Int64
            do {
                (batch, scanned) = try pool.read { db in try cursor.fetch(db) }
            } catch {
                return report(SharedStore.storeError(error, "read the history", path: cursor.store.path))
            }
            for transaction in batch {
                guard !cancelled.load(ordering: .relaxed) else { return }
                for damaged in transaction.damagedChanges {
                    report(
                        StoreError(
                            .corruptHistory,
                            "History row \(damaged.changeID) of transaction \(transaction.id) (table \(damaged.table)) "
                                + "cannot be read: \(damaged.reason). The rest of the transaction is delivered.",
                            path: cursor.store.path
                        )
                    )
                }
                do {
                    try handler(transaction)
                } catch {
                    // Not merged: offered again at the next commit.
                    return report(
                        StoreError(
                            .handlerFailed,
                            "The handler threw on transaction \(transaction.id): \(error). It stays unacknowledged "
                                + "and is offered again at the next commit.",
                            path: cursor.store.path,
                            underlyingError: error
                        )
                    )
                }
                do {
                    try pool.write { db in try cursor.acknowledge(through: transaction.id, db) }
                } catch {
                    return report(SharedStore.storeError(error, "store the history token", path: cursor.store.path))
                }
            }
            if scanned > cursor.current {
                do {
                    try pool.write { db in try cursor.acknowledge(through: scanned, db) }
                } catch {
                    return report(SharedStore.storeError(error, "store the history token", path: cursor.store.path))
                }
            }
            cursor.store.purgeIfDue()
            if batch.isEmpty { return }
        }
    }

    private func report(_ error: StoreError) {
        if let errorHandler {
            errorHandler(error)
        } else {
            cursor.store.logger.error("Remote change delivery failed", metadata: ["error": "\(error)"])
        }
    }
}

/// The transactions other processes commit, as an `AsyncSequence`; see
/// ``SharedStore/remoteChanges(consumer:tables:includingOwnWrites:)``.
///
/// Iterate it once. The database work runs on GRDB's queues, never blocking the cooperative thread pool.
public struct RemoteChangeSequence: AsyncSequence, Sendable {
    public typealias Element = StoreTransaction
    public typealias Failure = StoreError

    private let feed: Feed
    private let wakes: AsyncStream<Void>

    /// The cursor and the notifier observation, shared by the sequence and its iterator.
    final class Feed: Sendable {
        let cursor: Result<ConsumerCursor, StoreError>
        let observation: NotifierObservation?

        init(cursor: Result<ConsumerCursor, StoreError>, observation: NotifierObservation?) {
            self.cursor = cursor
            self.observation = observation
        }

        deinit { observation?.cancel() }
    }

    init(store: SharedStore, consumer: String?, tables: Set<String>?, includingOwnWrites: Bool) {
        let (wakes, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        self.wakes = wakes
        let cursor: Result<ConsumerCursor, StoreError>
        var observation: NotifierObservation?
        do throws(StoreError) {
            let made = try ConsumerCursor(
                store: store,
                name: consumer,
                tables: tables,
                includingOwnWrites: includingOwnWrites
            )
            do {
                observation = try store.notifier.observe(store.notificationName) { continuation.yield() }
            } catch {
                throw StoreError(
                    .notification,
                    "Could not observe commits: \(error.message)",
                    path: store.path,
                    underlyingError: error
                )
            }
            cursor = .success(made)
        } catch {
            cursor = .failure(error)
        }
        feed = Feed(cursor: cursor, observation: observation)
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(feed: feed, wakes: wakes.makeAsyncIterator())
    }

    /// The iterator. Asking for the next transaction acknowledges the previous one.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let feed: Feed
        var wakes: AsyncStream<Void>.AsyncIterator
        var buffer: [StoreTransaction] = []
        var unacknowledged: Int64?

        /// The next transaction; throws a ``StoreError`` when the history cannot be read.
        public mutating func next() async throws(StoreError) -> StoreTransaction? {
            let cursor = try feed.cursor.get()
            do {
                return try await nextTransaction(cursor)
            } catch {
                throw SharedStore.storeError(error, "read the history", path: cursor.store.path)
            }
        }

        private mutating func nextTransaction(_ cursor: ConsumerCursor) async throws -> StoreTransaction? {
            let pool = cursor.store.databasePool
            if let previous = unacknowledged {
                try await pool.write { db in try cursor.acknowledge(through: previous, db) }
                unacknowledged = nil
                cursor.store.purgeIfDue()
            }
            while true {
                if !buffer.isEmpty {
                    let transaction = buffer.removeFirst()
                    unacknowledged = transaction.id
                    return transaction
                }
                let (batch, scanned) = try await pool.read { db in try cursor.fetch(db) }
                if !batch.isEmpty {
                    buffer = batch
                    continue
                }
                if scanned > cursor.current {
                    try await pool.write { db in try cursor.acknowledge(through: scanned, db) }
                }
                guard await wakes.next() != nil, !Task.isCancelled else { return nil }
            }
        }
    }
}

/// An iterator belongs to the task that iterates: it is not `Sendable`.
@available(*, unavailable)
extension RemoteChangeSequence.AsyncIterator: Sendable {}
