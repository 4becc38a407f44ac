import Foundation
import Logging
import PostgresNIO
import WormholeKit

/// A shared store on PostgreSQL: one database for the processes of a group on every host, a history of every
/// transaction, and each process told of the others' commits, from a durable token.
///
/// It has the shape of `SharedStore` (SQLite, one host) from `WormholeStore`: `write(_:)` records each
/// transaction with its author, tables and row keys; ``remoteChanges(consumer:tables:includingOwnWrites:)`` and
/// ``observeRemoteChanges(consumer:tables:includingOwnWrites:on:errorHandler:handler:)`` deliver the transactions
/// other processes commit, from a consumer's stored token, once each, in commit order, a transaction acknowledged
/// when merged. Triggers record the history, so writes by other tools (`psql`, another service) are recorded too,
/// as the author `external`.
///
/// ```swift
/// let engine = try PostgresEngine(url: "postgres://app@db.example.com/app", group: "group.com.example.app")
/// let store = try PostgresStore(
///     engine: engine, name: "counters",
///     migrations: [.init("v1", sql: "CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL)")],
///     configuration: .init(author: "host-a"))
/// try await store.write { db in try db.query("UPDATE counter SET value = value + 1 WHERE id = 1") }
///
/// for try await transaction in store.remoteChanges(consumer: "host-a", tables: ["counter"]) {
///     print(transaction.author, "changed", transaction.tableNames)
/// }
/// ```
///
/// A store's tables are those of one PostgreSQL schema (`public` unless you name another); every table of it gets a
/// row trigger when the store opens, but the ``Configuration/untrackedTables``. Ordering, costs and security are in
/// the article "Sharing a store across hosts".
public final class PostgresStore: Sendable, CustomStringConvertible {
    /// The store's name in its group: processes that open the same name share its history.
    public let name: String
    /// The PostgreSQL schema that holds the store's tables.
    public let schema: String
    /// The group, as in the engine.
    public let group: String
    /// Who this process is in the history: the ``Configuration/author``.
    public let author: String
    /// The settings the store was opened with.
    public let configuration: Configuration

    let engine: PostgresEngine
    /// The store's own connections: their sessions carry `wormhole.author`, which the triggers record.
    let connections: Connections
    let logger: Logger
    private let lastPurge = Locked<Date>(.distantPast)

    public var description: String { "store \(name) of \(engine)" }

    /// Opens the store `name` of the engine's group, registering it if it is new, running the `migrations` it lacks
    /// and giving its tables the history trigger.
    ///
    /// The migrations run in one transaction under a lock of the store's own, so that processes on several hosts
    /// opening a new store at once run each of them once; the names of those that ran are kept in
    /// `wormhole.store_migrations`.
    ///
    /// - Parameters:
    ///   - engine: The engine whose server and group the store uses; it must stay open while the store is used.
    ///   - name: The store's name: a valid message identifier (see `MessageIdentifier`).
    ///   - schema: The PostgreSQL schema of the store's tables: the `search_path` of the store's connections, so
    ///     that your statements (migrations included) name its tables unqualified. A migration may create it.
    ///   - migrations: Your schema's migrations, in order. Never edit one that ran: add a new one.
    ///   - configuration: The author, the untracked tables, the history's maximum age.
    /// - Throws: `StoreError` with `StoreError.Code.unavailable` when the server cannot be reached, the name or the
    ///   schema is not valid (a schema: 1 to 63 bytes, no NUL), or the author is empty, holds a NUL or is `external`
    ///   (kept for writes made outside a store), `StoreError.Code.migrationFailed` when a migration fails (none of this opening's migrations is
    ///   kept), `StoreError.Code.database` when the server refuses (a role not granted the group).
    public init(
        engine: PostgresEngine,
        name: String,
        schema: String = "public",
        migrations: [Migration] = [],
        configuration: Configuration = Configuration()
    ) throws(StoreError) {
        do {
            try MessageIdentifier.validate(name)
        } catch {
            throw StoreError(.unavailable, "The store's name is not valid: \(error.message)", underlyingError: error)
        }
        guard !schema.isEmpty, schema.utf8.count <= 63, !schema.utf8.contains(0) else {
            throw StoreError(.unavailable, "\"\(schema)\" is not a PostgreSQL schema name (1 to 63 bytes).")
        }
        guard !configuration.author.isEmpty, configuration.author != "external", !configuration.author.utf8.contains(0)
        else {
            throw StoreError(
                .unavailable,
                "\"\(configuration.author)\" cannot be an author: it must not be empty, and `external` names writes "
                    + "made outside a store."
            )
        }
        self.engine = engine
        self.name = name
        self.schema = schema
        self.group = engine.group
        self.author = configuration.author
        self.configuration = configuration
        self.logger = configuration.logger
        connections = Connections(
            source: engine.core.connections.source,
            timeout: engine.core.connections.timeout,
            logger: configuration.logger,
            // Unqualified names in your statements are the store's tables.
            sessionParameters: [
                ("wormhole.author", configuration.author),
                ("search_path", "\"" + schema.replacingOccurrences(of: "\"", with: "\"\"") + "\""),
            ],
            server: engine.core.connections.learnedServer
        )
        do {
            try setUp(migrations)
        } catch {
            connections.close()
            throw error
        }
    }

    deinit { connections.close() }

    /// Closes the store's connections; later calls fail with `StoreError.Code.unavailable`.
    public func close() { connections.close() }

    /// Where the store is, for errors: the server (never its password) and the store's name.
    var location: String { "\(connections.server) store \(name)" }

    private func setUp(_ migrations: [Migration]) throws(StoreError) {
        try transaction(doing: "open the store") { (connection) throws(StoreError) in
            try connection.run(
                """
                SELECT pg_advisory_xact_lock(hashtextextended('wormhole.store/' || \(group) || '/' || \(name), 0))
                """
            )
            try connection.run(
                "INSERT INTO wormhole.stores (grp, store) VALUES (\(group), \(name)) ON CONFLICT DO NOTHING"
            )
            let applied = Set(
                try connection.run(
                    "SELECT name FROM wormhole.store_migrations WHERE grp = \(group) AND store = \(name)"
                ).map { (row) throws(StoreError) in try Self.decode(String.self, row, "the migrations that ran") }
            )
            var ran = false
            for migration in migrations where !applied.contains(migration.name) {
                do {
                    try migration.body(connection)
                } catch {
                    throw StoreError(
                        .migrationFailed,
                        "The migration \(migration.name) failed: \(error). No migration of this opening was kept.",
                        path: location,
                        underlyingError: error
                    )
                }
                try connection.run(
                    """
                    INSERT INTO wormhole.store_migrations (grp, store, name) VALUES (\(group), \(name), \(migration.name))
                    """
                )
                ran = true
            }
            if configuration.tracksTables { try track(connection, replacing: ran) }
        }
    }

    private func track(_ connection: StoreConnection, replacing: Bool) throws(StoreError) {
        let untracked = Array(configuration.untrackedTables)
        try connection.run(
            "SELECT wormhole.store_track(\(group), \(name), \(schema), \(untracked), \(replacing))"
        )
    }

    /// Gives the history trigger to the tables of the store's schema that lack it: call it after creating a table
    /// outside the store's migrations (the store's migrations do it themselves). Returns how many tables the store
    /// tracks.
    @discardableResult
    public func trackNewTables() throws(StoreError) -> Int {
        try transaction(doing: "track new tables") { (connection) throws(StoreError) in
            let untracked = Array(configuration.untrackedTables)
            let rows = try connection.run(
                "SELECT wormhole.store_track(\(group), \(name), \(schema), \(untracked), false)"
            )
            return Int(try Self.decode(Int32.self, rows.first, "the tables tracked"))
        }
    }

    // MARK: Writing and reading

    /// Runs `updates` in a transaction and records it in the history as this store's author; other processes are
    /// notified when it commits.
    ///
    /// Blocks its thread for the round trips; from `async` code, use `write(_:)`.
    ///
    /// - Throws: `StoreError.Code.handlerFailed` with the error `updates` threw (the transaction is rolled back),
    ///   `StoreError.Code.busy` on a deadlock or a serialization failure (run it again),
    ///   `StoreError.Code.database` when the server refuses a statement, `StoreError.Code.unavailable` when the
    ///   server cannot be reached (if that happens during the commit, the write may or may not have happened).
    @discardableResult
    public func write<T>(_ updates: (StoreConnection) throws -> T) throws(StoreError) -> T {
        try transaction(doing: "write") { (connection) throws(StoreError) in
            do {
                return try updates(connection)
            } catch let error as StoreError {
                throw error
            } catch {
                throw StoreError(
                    .handlerFailed,
                    "Could not write: your closure threw \(error). The transaction was rolled back.",
                    path: location,
                    underlyingError: error
                )
            }
        }
    }

    /// The asynchronous form of `write(_:)`: the round trips wait on a thread of their own, not on the
    /// cooperative pool.
    @discardableResult
    public func write<T: Sendable>(
        _ updates: @escaping @Sendable (StoreConnection) throws -> T
    ) async throws(StoreError) -> T {
        try await runBlocking { () throws(StoreError) in try self.write(updates) }
    }

    /// Runs `body` on a connection of the store, outside a transaction unless `body` begins one: for reads. A
    /// transaction `body` begins and leaves open is rolled back when it returns, so that the next call on the
    /// connection starts afresh.
    ///
    /// - Throws: as `write(_:)`.
    public func read<T>(_ body: (StoreConnection) throws -> T) throws(StoreError) -> T {
        try withConnection(doing: "read") { (connection) throws(StoreError) in
            do {
                let result = try body(connection)
                if connection.inTransaction.withLock({ $0 }) {
                    do throws(StoreError) { try connection.run("ROLLBACK") } catch { connection.discard() }
                }
                return result
            } catch let error as StoreError {
                connection.discard()
                throw error
            } catch {
                connection.discard()
                throw StoreError(
                    .handlerFailed,
                    "Could not read: your closure threw \(error).",
                    path: location,
                    underlyingError: error
                )
            }
        }
    }

    /// The asynchronous form of `read(_:)`.
    public func read<T: Sendable>(
        _ body: @escaping @Sendable (StoreConnection) throws -> T
    ) async throws(StoreError) -> T {
        try await runBlocking { () throws(StoreError) in try self.read(body) }
    }

    // MARK: History

    /// The recorded transactions after `token` (all of them from 0), oldest first, at most `limit`; with `tables`,
    /// only those that changed one of them, cut down to them.
    ///
    /// A read may return fewer than `limit` while more exist: it stops after about 10,000 changes (each transaction
    /// whole). Read again after the last one returned until none comes.
    public func transactions(
        after token: Int64 = 0,
        tables: Set<String>? = nil,
        limit: Int = 100
    ) throws(StoreError) -> [StoreTransaction] {
        try history.transactions(after: token, limit: limit, tables: tables).transactions
    }

    /// The newest history token: the id of the last committed transaction, or 0.
    public func currentToken() throws(StoreError) -> Int64 {
        try history.registerConsumer(nil)
    }

    /// The transactions other processes commit, from this consumer's history token on, as an `AsyncSequence`.
    ///
    /// A durable consumer (a `consumer` name) resumes where it left off, even after its process was away: its token
    /// is stored in the database, and a transaction counts as merged when the iteration asks for the next one. A
    /// consumer killed while merging a transaction gets it again. A new consumer starts at the newest transaction.
    /// With `consumer: nil`, the token lives in memory only. Observation begins when this method returns: it
    /// registers the consumer and starts listening before it returns, a round trip (up to the engine's connection
    /// time-out, 10 s, while the server is away), on the caller's thread. The iteration itself waits on threads of
    /// its own, never on the cooperative pool.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name, or nil for a passing one.
    ///   - tables: The tables in scope (CDShare's `sharedInScopeEntityNames`); nil for all.
    ///   - includingOwnWrites: Whether transactions by this store's ``author`` are delivered too.
    public func remoteChanges(
        consumer: String?,
        tables: Set<String>? = nil,
        includingOwnWrites: Bool = false
    ) -> RemoteChangeSequence {
        RemoteChangeSequence(
            history: history,
            consumer: consumer,
            tables: tables,
            includingOwnWrites: includingOwnWrites
        )
    }

    /// Calls `handler` with each transaction other processes commit, from this consumer's history token on.
    ///
    /// The handler runs where `execution` says (by default `CallbackExecution.automatic`: a serial queue of the
    /// observer's own, as PostgreSQL's notifications come on no inotify thread). A transaction is
    /// acknowledged when the handler returns without throwing; when it throws, the error goes to `errorHandler` as
    /// `StoreError.Code.handlerFailed` and the same transaction is offered again at the next commit.
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
            history: history,
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
        try history.storeToken(transaction.id, consumer: consumer)
    }

    /// The history token stored for a durable consumer, or nil if there is no such consumer.
    public func historyToken(forConsumer consumer: String) throws(StoreError) -> Int64? {
        try withConnection(doing: "read the token of \(consumer)") { (connection) throws(StoreError) in
            let rows = try connection.run(
                """
                SELECT token FROM wormhole.store_consumers
                WHERE grp = \(group) AND store = \(name) AND consumer = \(consumer)
                """
            )
            guard let row = rows.first else { return nil }
            return try Self.decode(Int64.self, row, "a consumer's token")
        }
    }

    /// Deletes consumers not seen for longer than `maximumAge` (by default ``Configuration/historyMaximumAge``), then
    /// the history that every remaining consumer has merged and that is older than ``mergedHistoryGrace``, or older
    /// than `maximumAge`, whichever reaches further.
    ///
    /// Passing consumers (a nil consumer name) are not registered: the grace gives them, on any host, that long to
    /// read a transaction that the registered ones have merged. Returns how many transactions went.
    @discardableResult
    public func purgeHistory(maximumAge: Duration? = nil) throws(StoreError) -> Int {
        let age = (maximumAge ?? configuration.historyMaximumAge).secondsValue
        return try withConnection(doing: "purge the history") { (connection) throws(StoreError) in
            let rows = try connection.run("SELECT wormhole.store_purge(\(group), \(name), \(age))")
            return Int(try Self.decode(Int64.self, rows.first, "the transactions purged"))
        }
    }

    /// How long history that every registered consumer has merged is kept all the same, for passing consumers: 30
    /// seconds, as `SharedStore`'s. The schema's purge function holds the figure (migration 4).
    public static let mergedHistoryGrace = Duration.seconds(30)

    /// Purges at most once a minute, after consumers move on.
    func purgeIfDue() {
        let due = lastPurge.withLock { last in
            guard Date().timeIntervalSince(last) > 60 else { return false }
            last = Date()
            return true
        }
        guard due else { return }
        do { try purgeHistory() } catch { logger.warning("History purge failed", metadata: ["error": "\(error)"]) }
    }

    var history: PostgresStoreHistory { PostgresStoreHistory(store: self) }

    // MARK: Connections

    func withConnection<Result>(
        doing what: String,
        _ body: (StoreConnection) throws(StoreError) -> Result
    ) throws(StoreError) -> Result {
        var failure: StoreError?
        let result: Result?
        do {
            result = try connections.withConnection { (connection) throws(WormholeError) -> Result? in
                let handle = StoreConnection(connection: connection, store: self)
                let outcome: Result?
                do throws(StoreError) {
                    outcome = try body(handle)
                } catch {
                    // A connection that failed goes back to the engine's pool as its own error, which closes it.
                    if let underlying = error.underlyingError as? WormholeError, underlying.code == .serverUnavailable {
                        throw underlying
                    }
                    failure = error
                    outcome = nil
                }
                // One whose session state is unknown (a transaction left open by a closure that threw, a failed
                // rollback) goes back as unavailable too, so that it is closed rather than kept.
                if handle.mustDiscard.withLock({ $0 }) { throw Self.discarding }
                return outcome
            }
        } catch {
            if let failure { throw failure }
            throw storeError(error, what)
        }
        if let failure { throw failure }
        return result!
    }

    /// Thrown to the engine's pool so that it closes a connection rather than keep it.
    private static let discarding = WormholeError(.serverUnavailable, "The store's connection is closed, not kept.")

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    func transaction<Result>(
        doing what: String,
        _ body: (StoreConnection) throws(StoreError) -> Result
    ) throws(StoreError) -> Result {
        try withConnection(doing: what) { (connection) throws(StoreError) in
            // READ COMMITTED whatever the server's default: the commit-time update of the store's row must see the
            // commits made since this transaction began (at REPEATABLE READ it would fail with 40001).
            do throws(StoreError) {
                try connection.run("BEGIN ISOLATION LEVEL READ COMMITTED")
            } catch {
                connection.discard()
                throw error
            }
            let result: Result
            do throws(StoreError) {
                result = try body(connection)
            } catch {
                do throws(StoreError) { try connection.run("ROLLBACK") } catch { connection.discard() }
                throw error
            }
            let tag: String
            do throws(StoreError) {
                tag = try connection.commit()
            } catch {
                connection.discard()
                throw error
            }
            // A statement that failed inside `body`, its error swallowed, aborted the transaction: COMMIT then
            // answers ROLLBACK, without an error.
            guard tag == "COMMIT" else {
                throw StoreError(
                    .database,
                    "Could not \(what): the transaction was rolled back by the server (a statement in it failed, its "
                        + "error caught inside your closure). Nothing was written.",
                    path: location
                )
            }
            return result
        }
    }

    /// The `StoreError` for an error of the engine's connections.
    func storeError(_ error: WormholeError, _ what: String) -> StoreError {
        let code: StoreError.Code
        if error.code == .serverUnavailable {
            code = .unavailable
        } else if error.message.contains("SQLSTATE 40001") || error.message.contains("SQLSTATE 40P01") {
            code = .busy
        } else {
            code = .database
        }
        return StoreError(code, "Could not \(what): \(error.message)", path: location, underlyingError: error)
    }

    static func decode<Value: PostgresDecodable>(
        _ type: Value.Type,
        _ row: PostgresRow?,
        _ what: String
    ) throws(StoreError) -> Value {
        do {
            return try WormholePostgres.decode(type, row, doing: "reading \(what)")
        } catch {
            throw StoreError(.database, error.message, underlyingError: error)
        }
    }
}

extension PostgresStore {
    /// How a store on PostgreSQL is opened and how it shares.
    public struct Configuration: Sendable {
        /// Who this process is in the history, so that others know who changed what and a process can skip its own
        /// writes; by default the process name. `external` is kept for writes made outside a store.
        public var author: String
        /// How long history is kept for a consumer that never comes back; 7 days by default.
        public var historyMaximumAge: Duration
        /// Tables of the store's schema whose changes are not recorded (caches, scratch tables).
        public var untrackedTables: Set<String>
        /// Whether opening gives the store's tables the history trigger; false for a process that only reads the
        /// history (a tool, a consumer elsewhere), so that it never changes the tables' triggers.
        public var tracksTables: Bool
        /// Where warnings go; never a password.
        public var logger: Logger

        /// Creates a configuration; every parameter has the default described on its property.
        public init(
            author: String = ProcessInfo.processInfo.processName,
            historyMaximumAge: Duration = .seconds(7 * 24 * 3600),
            untrackedTables: Set<String> = [],
            tracksTables: Bool = true,
            logger: Logger = Logger(label: "wormhole.postgres.store")
        ) {
            self.author = author
            self.historyMaximumAge = historyMaximumAge
            self.untrackedTables = untrackedTables
            self.tracksTables = tracksTables
            self.logger = logger
        }
    }

    /// One migration of your store's schema: a name recorded once it ran, and what it does.
    public struct Migration: Sendable {
        /// The name it is recorded under; never reuse one.
        public var name: String
        let body: @Sendable (StoreConnection) throws -> Void

        /// A migration that runs `body` on the migrating transaction's connection.
        public init(_ name: String, _ body: @escaping @Sendable (StoreConnection) throws -> Void) {
            self.name = name
            self.body = body
        }

        /// A migration that runs SQL statements of your own, in order (statements without parameters: DDL).
        public init(_ name: String, sql statements: String...) {
            self.init(name) { connection in
                for statement in statements { try connection.query(PostgresQuery(unsafeSQL: statement)) }
            }
        }
    }

    /// A connection of the store, as your closures get it: inside the transaction of `PostgresStore.write(_:)`,
    /// or for `PostgresStore.read(_:)`. Use it only inside the closure, on its thread.
    public struct StoreConnection {
        let connection: PostgresConnection
        let store: PostgresStore
        /// Set when the connection's session state is unknown: it is closed, not given back to the pool.
        let mustDiscard = Locked(false)
        /// Whether a statement run here began a transaction block that none has surely ended yet (by the command tags
        /// the server answered).
        let inTransaction = Locked(false)

        func discard() { mustDiscard.withLock { $0 = true } }

        /// Commits, and returns the command tag the server answered (`ROLLBACK` for an aborted transaction).
        func commit() throws(StoreError) -> String {
            do {
                let result = try store.connections.wait(
                    for: connection.query("COMMIT", logger: store.logger),
                    doing: "committing",
                    closing: connection
                )
                inTransaction.withLock { $0 = false }
                return result.metadata.command
            } catch {
                throw store.storeError(error, "commit")
            }
        }

        /// Runs one statement, its values bound as parameters (postgres-nio's string interpolation), and returns its
        /// rows; blocks until the server answers.
        ///
        /// - Throws: `StoreError.Code.database` when the server refuses it, `StoreError.Code.busy` on a deadlock
        ///   or a serialization failure, `StoreError.Code.unavailable` when the server cannot be reached.
        @discardableResult
        public func query(_ query: PostgresQuery) throws(StoreError) -> [PostgresRow] {
            try run(query)
        }

        @discardableResult
        func run(_ query: PostgresQuery) throws(StoreError) -> [PostgresRow] {
            do {
                let result = try store.connections.wait(
                    for: connection.query(query, logger: store.logger),
                    doing: "running a statement of the store",
                    closing: connection
                )
                switch result.metadata.command {
                case "BEGIN", "START TRANSACTION": inTransaction.withLock { $0 = true }
                // `COMMIT` and `END` end the block. `ROLLBACK` is left out: a rollback to a savepoint answers it too
                // and leaves the block open, so a read that ended its block that way is rolled back once more (the
                // server then warns that there is no transaction, and nothing is lost).
                case "COMMIT", "PREPARE TRANSACTION": inTransaction.withLock { $0 = false }
                default: break
                }
                return Array(result.rows)
            } catch {
                throw store.storeError(error, "run a statement")
            }
        }
    }
}

/// A store connection belongs to the closure it was given to.
@available(*, unavailable)
extension PostgresStore.StoreConnection: Sendable {}
