import Foundation
import GRDB
import Logging
import Synchronization
import WormholeKit

/// One SQLite database shared by every process of a group, each told at once what the others changed.
///
/// A store is a GRDB `DatabasePool` in the group's container, set up for sharing between processes as GRDB's sharing
/// guide advises: WAL, a busy timeout, IMMEDIATE write transactions, and set-up (creation, migrations) done by one
/// process at a time. On top of it:
///
/// - **History.** Every committed write is recorded with its author, time, and per table the inserted, updated and
///   deleted primary keys (see `StoreTransaction`). Triggers record it, so writes by other tools are seen too.
/// - **Remote changes.** After a write through `write(_:)` commits, the other processes are notified at once,
///   and receive the transactions since their own history token:
///   ``remoteChanges(consumer:tables:includingOwnWrites:)``.
/// - **Cross-process GRDB observation.** A `ValueObservation` or `DatabaseRegionObservation` in this process fires
///   after another process commits a change to its region.
///
/// ```swift
/// var migrator = DatabaseMigrator()
/// migrator.registerMigration("v1") { db in
///     try db.create(table: "counter") { t in
///         t.primaryKey("id", .integer)
///         t.column("value", .integer).notNull()
///     }
/// }
/// let store = try SharedStore(
///     applicationGroupIdentifier: "group.com.example.app", name: "shared.sqlite", migrator: migrator,
///     configuration: .init(author: "app"))
/// try await store.write { db in try db.execute(sql: "UPDATE counter SET value = value + 1") }
///
/// for try await transaction in store.remoteChanges(consumer: "app", tables: ["counter"]) {
///     print(transaction.author, "changed", transaction.tableNames)
/// }
/// ```
public final class SharedStore: Sendable {
    /// The database, for reads and for GRDB observation. Write through `write(_:)`, which records and
    /// notifies.
    public let databasePool: DatabasePool
    /// The database file.
    public let path: String
    /// Who this process is in the history: the ``Configuration/author``.
    public let author: String
    /// The settings the store was opened with.
    public let configuration: Configuration

    /// The notifier that tells other processes of commits.
    public let notifier: DirectoryNotifier
    let notificationName: String
    let logger: Logger
    private let schemaVersion = Locked<Int?>(nil)
    private let bridge = Locked<NotifierObservation?>(nil)
    private let bridgedThrough = Locked<Int64>(0)
    private let lastPurge = Locked<Date>(.distantPast)
    /// Where the store's own notification work runs: never on the notifier's thread, never on the cooperative pool.
    let queue = DispatchQueue(label: "wormhole.store")
    /// The read-only connection of the remote-change consumers' history reads, opened by the first.
    private let historyConnection = Locked<DatabaseQueue?>(nil)

    /// Reads the history on a read-only connection of its own, which the history reads that follow each
    /// notification of a commit share: a read through the pool first takes one of its readers, and that bookkeeping
    /// (GRDB's `Pool`) cost about as much as the read itself in a profile of a remote change's way from one process
    /// to another. The connection is opened as the pool opens its readers, with the store's configuration.
    func readHistory<T>(_ read: (Database) throws -> T) throws -> T {
        let connection = try historyConnection.withLock { connection in
            if let connection { return connection }
            var grdb = configuration.databaseConfiguration
            grdb.readonly = true
            grdb.busyMode = .timeout(configuration.busyTimeout.seconds)
            grdb.observesSuspensionNotifications = true
            let opened = try DatabaseQueue(path: path, configuration: grdb)
            connection = opened
            return opened
        }
        return try connection.inDatabase(read)
    }

    /// Opens (creating if needed) a store named `name` in an application group's container.
    ///
    /// - Throws: `StoreError`; a bad group or name is `StoreError.Code.unavailable`.
    public convenience init(
        applicationGroupIdentifier: String,
        optionalDirectory: String? = nil,
        name: String = "store.sqlite",
        migrator: DatabaseMigrator = DatabaseMigrator(),
        configuration: Configuration = Configuration()
    ) throws(StoreError) {
        let directory: String
        do {
            try MessageIdentifier.validate(name)
            directory = try GroupContainer.directory(
                forApplicationGroupIdentifier: applicationGroupIdentifier,
                optionalDirectory: optionalDirectory
            )
        } catch {
            throw StoreError(.unavailable, error.message, underlyingError: error)
        }
        try self.init(path: directory + "/" + name, migrator: migrator, configuration: configuration)
    }

    /// Opens (creating if needed) the store at `path`; its directory is created with mode 0700.
    ///
    /// Creation, the history tables and the migrations run under a file lock, so several processes may open a new
    /// store at once: one sets it up, the others find it ready.
    ///
    /// - Throws: `StoreError.Code.unavailable` when the file cannot be opened,
    ///   `StoreError.Code.migrationFailed` when a migration throws.
    public init(
        path: String,
        migrator: DatabaseMigrator = DatabaseMigrator(),
        configuration: Configuration = Configuration()
    ) throws(StoreError) {
        self.path = path
        self.author = configuration.author
        self.configuration = configuration
        self.logger = configuration.logger
        let url = URL(fileURLWithPath: path)
        let name = url.lastPathComponent
        guard MessageIdentifier.isValid(name) else {
            throw StoreError(.unavailable, "The store's file name \"\(name)\" is not a valid name.", path: path)
        }
        notificationName = "store." + name
        do {
            notifier = try DirectoryNotifier(
                directory: url.deletingLastPathComponent().path,
                strategy: configuration.notification,
                logger: configuration.logger
            )
        } catch {
            throw StoreError(
                .unavailable,
                "The store's directory is unusable: \(error.message)",
                path: path,
                underlyingError: error
            )
        }

        var grdb = configuration.databaseConfiguration
        grdb.busyMode = .timeout(configuration.busyTimeout.seconds)
        grdb.journalMode = .wal
        // No lock in the container while the process is suspended (iOS's `0xdead10cc`): GRDB suspends the database
        // when `Wormhole.suspend()` posts its notification.
        grdb.observesSuspensionNotifications = true
        Self.followSuspension()
        let pool: DatabasePool
        // Setting up takes a lock, then SQLite's: neither while suspended.
        guard SuspensionGate.enter() else {
            throw StoreError(
                .suspended,
                "Could not open the store: this process's wormholes are suspended (Wormhole.suspend()), so no lock "
                    + "may be taken. Open it after Wormhole.resume().",
                path: path
            )
        }
        defer { SuspensionGate.leave() }
        let lock = try SetupLock(path: path + ".wormhole-lock", timeout: configuration.busyTimeout)
        do {
            defer { lock.unlock() }
            // Made here with mode 0600 before SQLite opens it; SQLite gives its -wal and -shm files the same mode.
            _ = Descriptor.open(path: path, flags: O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, permissions: 0o600)
            // SQLite follows a link: one planted at the database's path is refused, never opened.
            var entry = stat()
            if lstat(path, &entry) == 0, entry.st_mode & S_IFMT != S_IFREG {
                throw StoreError(
                    .unavailable,
                    "The database's path is not a regular file (a symbolic link, say), which a store never opens: "
                        + "remove it.",
                    path: path
                )
            }
            do {
                pool = try DatabasePool(path: path, configuration: grdb)
            } catch {
                throw StoreError(
                    .unavailable,
                    "The database could not be opened: \(error)",
                    path: path,
                    underlyingError: error
                )
            }
            do {
                try pool.write { db in try HistorySchema.create(db) }
            } catch {
                throw Self.storeError(error, "create the history tables", path: path)
            }
            do {
                try migrator.migrate(pool)
            } catch {
                throw StoreError(.migrationFailed, "A migration failed: \(error)", path: path, underlyingError: error)
            }
            do {
                try pool.write { db in try HistorySchema.installTriggers(db, untracked: configuration.untrackedTables) }
            } catch {
                throw Self.storeError(error, "install the history triggers", path: path)
            }
        }
        databasePool = pool
        // A suspension between `followSuspension()` and the pool's opening told GRDB before the pool listened.
        if SuspensionGate.isSuspended {
            NotificationCenter.default.post(name: Database.suspendNotification, object: nil)
        }
        if configuration.observesRemoteChanges { try startBridge() }
    }

    deinit {
        bridge.withLock { $0?.cancel() }
        // Before the pool's writer, which then checkpoints the WAL as the last connection and removes it, as GRDB's
        // pool closes its readers first.
        try? historyConnection.withLock { $0 }?.close()
    }

    // MARK: Writing

    /// Runs `updates` in an IMMEDIATE write transaction, records it in the history as this store's author, and after
    /// it commits, notifies the other processes.
    ///
    /// Changes that other tools made since the last write through a store are first recorded as a transaction of
    /// their own, of author `external`. A table created inside `updates` is tracked from the next write on.
    ///
    /// - Throws: `StoreError.Code.busy` when another process held the database longer than the busy timeout,
    ///   `StoreError.Code.database` for another database error, `StoreError.Code.handlerFailed` with the error
    ///   `updates` threw as its `StoreError.underlyingError` (the transaction is rolled back in both cases),
    ///   `StoreError.Code.suspended` while this process's wormholes are suspended (`Wormhole.suspend()`).
    @discardableResult
    public func write<T>(_ updates: (Database) throws -> T) throws(StoreError) -> T {
        // SQLite's write lock is a lock in the container: the permit is held until it is let go, and refused while
        // suspended before the transaction begins (GRDB's suspension would refuse it too, a little later).
        try Self.takePermit("write", path: path)
        defer { SuspensionGate.leave() }
        let (value, recorded): (T, Int64?)
        do {
            (value, recorded) = try databasePool.write { db in
                let (last, closedExternal) = try prepareWrite(db)
                let value = try updates(db)
                // Another tool's changes, closed above, are announced even when `updates` changed nothing tracked.
                return (
                    value, try HistorySchema.endWrite(db, since: last, author: author) ?? (closedExternal ? last : nil)
                )
            }
        } catch {
            throw Self.storeError(error, "write", path: path)
        }
        if recorded != nil { notifyOtherProcesses() }
        return value
    }

    /// The asynchronous form of `write(_:)`: the database work runs on GRDB's writer queue, not on the caller's
    /// thread.
    @discardableResult
    public func write<T: Sendable>(
        _ updates: @escaping @Sendable (Database) throws -> T
    ) async throws(StoreError) -> T {
        // SQLite's write lock is a lock in the container: the permit is held until it is let go, and refused while
        // suspended before the transaction begins (GRDB's suspension would refuse it too, a little later).
        try Self.takePermit("write", path: path)
        defer { SuspensionGate.leave() }
        let (value, recorded): (T, Int64?)
        do {
            (value, recorded) = try await databasePool.write { [self] db in
                let (last, closedExternal) = try prepareWrite(db)
                let value = try updates(db)
                return (
                    value, try HistorySchema.endWrite(db, since: last, author: author) ?? (closedExternal ? last : nil)
                )
            }
        } catch {
            throw Self.storeError(error, "write", path: path)
        }
        if recorded != nil { notifyOtherProcesses() }
        return value
    }

    /// Closes what other tools wrote, and tracks tables created since the last write; returns the last history id,
    /// and whether it closed other tools' changes into a transaction of their own.
    private func prepareWrite(_ db: Database) throws -> (last: Int64, closedExternal: Bool) {
        let (last, closedExternal) = try HistorySchema.beginWrite(db)
        // GRDB runs the same cheap pragma before its reads; here it finds tables created since the last write.
        let version = Int(try db.schemaVersion())
        if schemaVersion.withLock({ $0 }) != version {
            try HistorySchema.installTriggers(db, untracked: configuration.untrackedTables)
            let installed = Int(try db.schemaVersion())
            schemaVersion.withLock { $0 = installed }
        }
        return (last, closedExternal)
    }

    private func notifyOtherProcesses() {
        do {
            try notifier.post(notificationName)
        } catch {
            // The commit stands; other processes will see it on their next notification or start.
            logger.error("Could not notify other processes of a commit", metadata: ["error": "\(error)"])
        }
    }

    /// Reads from the database (a GRDB read: concurrent with writes, in WAL mode).
    ///
    /// - Throws: `StoreError.Code.database`, or `StoreError.Code.handlerFailed` with the error `value` threw.
    public func read<T>(_ value: (Database) throws -> T) throws(StoreError) -> T {
        do {
            return try databasePool.read(value)
        } catch {
            throw Self.storeError(error, "read", path: path)
        }
    }

    // MARK: History

    /// The recorded transactions after `token` (all of them from 0), oldest first, at most `limit`.
    public func transactions(
        after token: Int64 = 0,
        tables: Set<String>? = nil,
        limit: Int = 100
    ) throws(StoreError) -> [StoreTransaction] {
        try read { db in try HistorySchema.transactions(db, after: token, limit: limit, tables: tables).transactions }
    }

    /// The newest history token: the id of the last recorded transaction, or 0.
    public func currentToken() throws(StoreError) -> Int64 {
        try read { db in try HistorySchema.currentToken(db) }
    }

    /// Deletes the history that every registered consumer has merged and that is older than
    /// ``mergedHistoryGrace``, and consumers (with what only they needed) not seen for longer than `maximumAge` (by
    /// default ``Configuration/historyMaximumAge``).
    ///
    /// With no consumer registered, history older than `maximumAge` is deleted. Passing consumers (a nil consumer
    /// name) are not registered: the grace gives them, in any process, that long to read a transaction that the
    /// registered ones have merged. Returns how many transactions went.
    @discardableResult
    public func purgeHistory(maximumAge: Duration? = nil) throws(StoreError) -> Int {
        try purgeHistory(maximumAgeInSeconds: (maximumAge ?? configuration.historyMaximumAge).seconds)
    }

    /// Deletes merged history; `maximumAge` in seconds.
    @available(*, deprecated, message: "Pass a Duration: purgeHistory(maximumAge: .seconds(3600)).")
    @discardableResult
    public func purgeHistory(maximumAge: TimeInterval) throws(StoreError) -> Int {
        try purgeHistory(maximumAgeInSeconds: maximumAge)
    }

    private func purgeHistory(maximumAgeInSeconds maximumAge: TimeInterval) throws(StoreError) -> Int {
        try Self.takePermit("purge the history", path: path)
        defer { SuspensionGate.leave() }
        let cutoff = Date().timeIntervalSince1970 - maximumAge
        do {
            return try databasePool.write { db in
                try db.execute(sql: "DELETE FROM wormhole_consumer WHERE seen_at < ?", arguments: [cutoff])
                // What every consumer still registered (seen within the cutoff) has merged, but not the last
                // `mergedHistoryGrace`, even when merged: passing consumers, which no table lists, read it. Never
                // what one of them has not merged, however old: it would skip it. With none registered, what is
                // older than the cutoff.
                let registered = try Int64.fetchOne(db, sql: "SELECT MIN(token) FROM wormhole_consumer")
                let settledBefore = Date().timeIntervalSince1970 - Self.mergedHistoryGrace.seconds
                let settled = try HistorySchema.lastCommit(db, before: settledBefore)
                let through = try registered.map { min($0, settled) } ?? HistorySchema.lastCommit(db, before: cutoff)
                let transactions =
                    try Int.fetchOne(
                        db,
                        sql: """
                            SELECT COUNT(*) FROM wormhole_history WHERE operation = 'commit' AND id <= ?
                            AND id < (SELECT MAX(id) FROM wormhole_history)
                            """,
                        arguments: [through]
                    ) ?? 0
                // The newest row stays, so that row ids, and therefore tokens, are never reused.
                try db.execute(
                    sql: "DELETE FROM wormhole_history WHERE id <= ? AND id < (SELECT MAX(id) FROM wormhole_history)",
                    arguments: [through]
                )
                return transactions
            }
        } catch {
            throw Self.storeError(error, "purge the history", path: path)
        }
    }

    /// How long history that every registered consumer has merged is kept all the same, for passing consumers.
    public static let mergedHistoryGrace = Duration.seconds(30)

    /// Purges at most once a second, after consumers move on.
    func purgeIfDue() {
        guard !SuspensionGate.isSuspended else { return }  // a write: put off to a wake-up after resuming
        let due = lastPurge.withLock { last in
            guard Date().timeIntervalSince(last) > 1 else { return false }
            last = Date()
            return true
        }
        if due {
            do { try purgeHistory() } catch { logger.warning("History purge failed", metadata: ["error": "\(error)"]) }
        }
    }

    // MARK: GRDB observation across processes

    /// Observes the store's notifications and tells this process's GRDB observers which tables other processes
    /// changed, with `Database.notifyChanges(in:)`.
    private func startBridge() throws(StoreError) {
        let start: Int64
        do { start = try currentToken() } catch { throw Self.storeError(error, "read the history", path: path) }
        bridgedThrough.withLock { $0 = start }
        let observation: NotifierObservation
        do {
            observation = try notifier.observe(notificationName) { [weak self] in
                guard let self else { return }
                queue.async { self.bridgeRemoteChanges() }
            }
        } catch {
            throw StoreError(
                .notification,
                "Could not observe other processes' commits: \(error.message)",
                path: path,
                underlyingError: error
            )
        }
        // Other processes' commits made while this one was suspended are bridged when it resumes.
        let resumptions = SuspensionGate.observe { [weak self] suspended in
            guard !suspended, let self else { return }
            queue.async { self.bridgeRemoteChanges() }
        }
        bridge.withLock {
            $0 = NotifierObservation {
                observation.cancel()
                resumptions.cancel()
            }
        }
    }

    /// Suspends and resumes this process's GRDB databases that observe suspension (every shared store's) with the
    /// wormholes' ``Wormhole/suspend()`` and ``Wormhole/resume()``, from the first store opened on.
    private static func followSuspension() {
        _ = suspensionFollower
    }

    /// Told before `suspend()` and `resume()` return, so that a write right after `resume()` finds GRDB resumed.
    private static let suspensionFollower: Void = SuspensionGate.observeImmediately { suspended in
        NotificationCenter.default.post(
            name: suspended ? Database.suspendNotification : Database.resumeNotification,
            object: nil
        )
    }

    private func bridgeRemoteChanges() {
        // Put off while suspended (the write would take a lock): `startBridge` runs it again on resuming.
        guard SuspensionGate.enter() else { return }
        defer { SuspensionGate.leave() }
        do {
            let after = bridgedThrough.withLock { $0 }
            var tables = Set<String>()
            var last = after
            try databasePool.read { db in
                var token = after
                while true {
                    let (batch, scanned) = try HistorySchema.transactions(db, after: token, limit: 500, tables: nil)
                    for transaction in batch where transaction.author != author {
                        tables.formUnion(transaction.tableNames)
                    }
                    if scanned == token { break }
                    token = scanned
                }
                last = token
            }
            if !tables.isEmpty {
                try databasePool.write { db in
                    for table in tables { try db.notifyChanges(in: Table(table)) }
                }
            }
            // Only once the observers were told: a failed notification is tried again at the next wake-up.
            bridgedThrough.withLock { $0 = last }
        } catch {
            logger.error("Could not pass other processes' changes to GRDB observers", metadata: ["error": "\(error)"])
        }
    }

    /// A write refused before it began, since the process is suspended.
    struct Suspended: Error {}

    /// Takes a suspension permit for a write of the database (``SuspensionGate``): the caller gives it back with
    /// `SuspensionGate.leave()` once the write is over; throws ``StoreError/Code/suspended`` while suspended.
    static func takePermit(_ action: String, path: String) throws(StoreError) {
        guard SuspensionGate.enter() else { throw storeError(Suspended(), action, path: path) }
    }

    static func storeError(_ error: any Error, _ action: String, path: String) -> StoreError {
        if let error = error as? StoreError { return error }
        if error is Suspended
            || (error as? DatabaseError).map({ [.SQLITE_INTERRUPT, .SQLITE_ABORT].contains($0.resultCode) }) == true
                && SuspensionGate.isSuspended
        {
            return StoreError(
                .suspended,
                "Could not \(action): this process's wormholes are suspended (Wormhole.suspend()), and GRDB with them, "
                    + "so no lock on the database may be taken. Nothing was written. Try again after Wormhole.resume().",
                path: path,
                underlyingError: error
            )
        }
        if let database = error as? DatabaseError, database.resultCode == .SQLITE_BUSY {
            return StoreError(
                .busy,
                "Could not \(action): another process held the database longer than the busy timeout.",
                path: path,
                underlyingError: error
            )
        }
        guard error is DatabaseError else {
            // Thrown by the caller's closure, not by the database.
            return StoreError(
                .handlerFailed,
                "Could not \(action): your closure threw \(error).",
                path: path,
                underlyingError: error
            )
        }
        return StoreError(.database, "Could not \(action): \(error)", path: path, underlyingError: error)
    }
}

/// An exclusive `flock` lock on a file next to the database, held while a process sets the store up.
struct SetupLock: ~Copyable {
    private let file: OwnedDescriptor

    /// Takes the lock, waiting at most `timeout` for a process that holds it (one stopped in a debugger in the middle
    /// of a migration would otherwise hold every other one for good).
    init(path: String, timeout: Duration) throws(StoreError) {
        let opened = try Self.open(path)
        let start = ContinuousClock.now
        while true {
            let taken: Bool
            switch opened.descriptor.tryLockExclusive() {
            case .success(let value): taken = value
            case .failure(let errno):
                throw StoreError(
                    .unavailable,
                    "Could not take the set-up lock: \(errno).",
                    path: path,
                    underlyingError: errno
                )
            }
            if taken { break }
            if SuspensionGate.isSuspended {
                throw StoreError(
                    .suspended,
                    "The process was suspended (Wormhole.suspend()) while it waited for another process to set the "
                        + "store up; open it after Wormhole.resume().",
                    path: path
                )
            }
            guard start.duration(to: .now) < timeout else {
                throw StoreError(
                    .busy,
                    "Another process has been setting the store up (migrating it) for longer than the busy time-out, "
                        + "holding this lock; try again once it is done.",
                    path: path
                )
            }
            usleep(10_000)
        }
        file = opened
    }

    func unlock() { file.descriptor.unlock() }

    private static func open(_ path: String) throws(StoreError) -> OwnedDescriptor {
        switch Descriptor.open(path: path, flags: O_RDWR | O_CREAT | O_NOFOLLOW) {
        case .success(let opened): return opened
        case .failure(let errno):
            throw StoreError(
                .unavailable,
                "Could not open the set-up lock: \(errno).",
                path: path,
                underlyingError: errno
            )
        }
    }
}

extension Duration {
    /// The duration in seconds, as Foundation and GRDB take it.
    var seconds: TimeInterval { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
