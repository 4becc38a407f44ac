import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import WormholeKit

/// An engine that keeps every delivery mode in a PostgreSQL database, so that the processes of a wormhole may run
/// on several hosts: mailboxes, durable queues, live messages and requests, suites and file transfers.
///
/// ```swift
/// let engine = try PostgresEngine(url: "postgres://app@db.example.com/app", group: "group.com.example.app")
/// let wormhole = Wormhole(engine: engine, sender: "worker-1")
/// try wormhole.queue("jobs").enqueue("first job")
/// ```
///
/// The tables hold the data: every write is one transaction, and one `pg_notify` per write wakes the other
/// processes of the group, which then read from their stored positions. Notifications are only hints: a process
/// whose connection drops reconnects with back-off and reads again, so it misses nothing its mode promises.
///
/// Each call blocks its thread for a round trip to the server (a few hundred microseconds on one host), as a file
/// call does on the directory engine; the wormhole's `async` calls and sequences do their waiting on threads of
/// their own. The engine is a `Service` of swift-service-lifecycle: run it in a `ServiceGroup` to close its
/// connections on shutdown, or call ``close()``.
///
/// Groups share a database safely: rows carry their group, a role that does not own the tables sees only the
/// groups granted to it (row-level security), and each group's notification channel has a random name that only
/// its members can read. See the article "Across hosts".
public final class PostgresEngine: WormholeEngine, Service, CustomStringConvertible {
    /// The group whose data this engine reads and writes.
    public let group: String
    let core: PostgresCore

    public let transiting: any Transiting
    public let notifier: any Notifier

    public var description: String { "PostgreSQL \(core.connections.server) group \(group)" }

    /// Connects to the server at `url` and opens `group`, setting up the schema first when `setsUpSchema` is true.
    ///
    /// - Parameters:
    ///   - url: `postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=MODE` (see ``PostgresLocation``).
    ///   - group: The group, as an App Group identifier: processes that give the same group share everything.
    ///   - setsUpSchema: Whether to run the schema's migrations when the database lacks them (the role must be
    ///     allowed to create the schema `wormhole`); when false, `WormholeError.Code.serverRejected` tells to run
    ///     `wormhole postgres setup`.
    ///   - timeout: How long one statement may take before the call fails with `WormholeError.Code.serverUnavailable`
    ///     (within a live request, its own time-out, when shorter, after which it gives `timedOut`). The server is
    ///     told too (`statement_timeout` and `lock_timeout`, 100 and 200 ms shorter; `idle_in_transaction_session_timeout`,
    ///     twice as long and at least a minute), so that it stops what the engine gave up on.
    ///   - logger: Where the engine logs reconnections and lost notifications; never a password.
    /// - Throws: `WormholeError` with `WormholeError.Code.serverUnavailable` when the server cannot be reached,
    ///   `WormholeError.Code.serverRejected` when it refuses the role or the group,
    ///   `WormholeError.Code.invalidIdentifier` for a bad group.
    public convenience init(
        url: String,
        group: String,
        setsUpSchema: Bool = true,
        timeout: Duration = .seconds(30),
        logger: Logger = Logger(label: "wormhole.postgres")
    ) throws(WormholeError) {
        try self.init(
            location: PostgresLocation(url: url),
            group: group,
            setsUpSchema: setsUpSchema,
            timeout: timeout,
            logger: logger
        )
    }

    /// Connects with a configuration of postgres-nio (one you already build for postgres-nio) and opens
    /// `group`; the other parameters are as in ``init(url:group:setsUpSchema:timeout:logger:)``.
    public convenience init(
        configuration: PostgresConnection.Configuration,
        group: String,
        setsUpSchema: Bool = true,
        timeout: Duration = .seconds(30),
        logger: Logger = Logger(label: "wormhole.postgres")
    ) throws(WormholeError) {
        try self.init(
            location: PostgresLocation(configuration: configuration),
            group: group,
            setsUpSchema: setsUpSchema,
            timeout: timeout,
            logger: logger
        )
    }

    /// Borrows its connections from `client`, a postgres-nio client you already run, and opens `group`; the other
    /// parameters are as in ``init(url:group:setsUpSchema:timeout:logger:)``.
    ///
    /// ```swift
    /// let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
    /// try await withThrowingDiscardingTaskGroup { tasks in
    ///     // On an executor of its own, the client opens connections even while the engine's calls block threads.
    ///     tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
    ///     let engine = try await PostgresEngine(client: client, group: "group.com.example.app")
    ///     defer {
    ///         engine.close()  // first: the engine stops borrowing and gives its connections back
    ///         tasks.cancelAll()
    ///     }
    ///     let wormhole = Wormhole(engine: engine, sender: "worker-1")
    ///     for try await job in try await wormhole.queue("jobs").messages(consumer: "worker-1", as: String.self) {
    ///         print("job:", job.value)
    ///         if job.value == "last" { break }
    ///     }
    /// }
    /// ```
    ///
    /// Every call borrows a connection for its statements (a store's calls too, with its session settings set when
    /// borrowed and set back before going back) and keeps it idle for 100 ms after, so that a burst of calls borrows
    /// once. The engine's listening connection is borrowed for as long as it listens, and goes back after
    /// ``close()`` with its `LISTEN`s ended, its advisory lock released and its settings set back, so that nothing
    /// of the engine's reaches your code. Size the client's pool for your own code's connections, plus the listening
    /// one, plus the engine's calls in flight at once (at least two).
    ///
    /// The client must be running before the engine opens and for as long as the engine works. The engine's calls
    /// are synchronous: each blocks its thread until the client lends a connection. Run the client on a
    /// ``PostgresClientExecutor``, as above, so that it opens connections even while such calls block every thread
    /// of Swift's cooperative pool; otherwise make the calls from threads of your own. The article "Across hosts"
    /// says more.
    ///
    /// - Throws: as ``init(url:group:setsUpSchema:timeout:logger:)``; `WormholeError.Code.serverUnavailable` too when
    ///   the client lends no connection within `timeout` (it is not running, or its pool is used up).
    public convenience init(
        client: PostgresClient,
        group: String,
        setsUpSchema: Bool = true,
        timeout: Duration = .seconds(30),
        logger: Logger = Logger(label: "wormhole.postgres")
    ) async throws(WormholeError) {
        try GroupName.validate(group)
        let connections = Connections(source: .client(client), timeout: timeout, logger: logger)
        // Borrowing blocks its thread until the client lends: not a thread of the cooperative pool.
        try await runBlocking { () throws(WormholeError) in
            try Self.open(group, connections, setsUpSchema: setsUpSchema)
        }
        self.init(connections: connections, group: group, logger: logger)
    }

    convenience init(
        location: PostgresLocation,
        group: String,
        setsUpSchema: Bool,
        timeout: Duration,
        logger: Logger
    ) throws(WormholeError) {
        try GroupName.validate(group)
        let connections = Connections(source: .location(location), timeout: timeout, logger: logger)
        try Self.open(group, connections, setsUpSchema: setsUpSchema)
        self.init(connections: connections, group: group, logger: logger)
    }

    /// An engine on connections whose group is open. (Its channel is not kept: the listening connection reads it,
    /// and statements read it on the server, so that a rotation moves both.)
    init(connections: Connections, group: String, logger: Logger) {
        self.group = group
        core = PostgresCore(connections: connections, group: group, logger: logger)
        transiting = PostgresTransiting(engine: core)
        notifier = PostgresNotifier(engine: core)
    }

    /// Checks the schema (migrating it first when `setsUpSchema`) and opens `group` (registering it when it is new,
    /// and making sure this role sees it); closes `connections` when it fails.
    static func open(
        _ group: String,
        _ connections: Connections,
        setsUpSchema: Bool
    ) throws(WormholeError) {
        do throws(WormholeError) {
            if setsUpSchema {
                // Migrating also refuses a schema newer than this build's.
                if try Schema.currentVersion(connections) != Schema.version { try Schema.migrate(connections) }
            } else {
                let version = try Schema.currentVersion(connections)
                guard version == Schema.version else {
                    throw WormholeError(
                        .serverRejected,
                        "The database \(connections.server) has the wormhole schema at version \(version), this "
                            + "build needs \(Schema.version): run `wormhole postgres setup --postgres URL`."
                    )
                }
            }
            _ = try openGroup(group, connections)
        } catch {
            connections.close()
            throw error
        }
    }

    /// Registers the group if it is new, and reads its notification channel.
    ///
    /// Two processes registering the same new group at once: the `INSERT` of the second waits for the first's commit
    /// and then inserts nothing, while its `SELECT` reads the snapshot taken before that commit and finds nothing
    /// either. The next statement's snapshot sees the row, so the query is run again.
    private static func openGroup(_ group: String, _ connections: Connections) throws(WormholeError) -> String {
        for _ in 0..<3 {
            if let channel = try queryGroupChannel(group, connections) { return channel }
        }
        throw WormholeError(
            .serverRejected,
            "PostgreSQL returned no row, three times, while opening the group \(group)."
        )
    }

    private static func queryGroupChannel(_ group: String, _ connections: Connections) throws(WormholeError) -> String?
    {
        let rows = try connections.query(
            """
            WITH made AS (
                INSERT INTO wormhole.groups (grp, channel)
                VALUES (\(group), 'wormhole_' || md5(gen_random_uuid()::text || clock_timestamp()::text))
                ON CONFLICT (grp) DO NOTHING RETURNING channel)
            SELECT channel FROM made UNION ALL SELECT channel FROM wormhole.groups WHERE grp = \(group)
            """,
            doing: "opening the group \(group)"
        )
        guard let row = rows.first else { return nil }
        return try decode(String.self, row, doing: "opening the group \(group)")
    }

    public func queueLog(
        _ identifier: String,
        sender: String,
        retention: Duration
    ) throws(WormholeError)
        -> any QueueLog
    {
        try MessageIdentifier.validate(identifier)
        return PostgresQueueLog(engine: core, identifier: identifier, sender: sender, retention: retention)
    }

    public func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore {
        try MessageIdentifier.validate(name)
        return PostgresSuiteStore(engine: core, name: name)
    }

    public func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
        PostgresLiveTransport(engine: core, sender: sender)
    }

    public func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
        try MessageIdentifier.validate(identifier)
        return PostgresTransferStaging(engine: core, channel: identifier)
    }

    /// Waits for the service group's graceful shutdown, then closes the engine.
    public func run() async throws {
        try? await gracefulShutdown()
        close()
    }

    /// Stops listening and closes every connection; calls made afterwards fail with
    /// `WormholeError.Code.serverUnavailable`.
    public func close() { core.close() }
}

/// What every mode of one engine shares: its connections, its listening hub and its group.
final class PostgresCore: Sendable {
    let connections: Connections
    let hub: NotificationHub
    let group: String
    let logger: Logger
    /// Whether releasing the core closes its connections (not when it borrows another's, as the administration's).
    private let ownsConnections: Bool

    init(connections: Connections, group: String, logger: Logger, ownsConnections: Bool = true) {
        self.ownsConnections = ownsConnections
        self.connections = connections
        self.group = group
        self.logger = logger
        hub = NotificationHub(
            connections: connections,
            group: group,
            safetyPollInterval: .seconds(10),
            logger: logger
        )
    }

    func close() {
        hub.close()
        connections.close()
    }

    // When the last object of any mode goes: a queue or a suite may outlive the engine and wormhole it came from.
    deinit {
        hub.close()
        if ownsConnections { connections.close() }
    }
}

/// A group's name: what an App Group identifier may hold.
enum GroupName {
    static func validate(_ group: String) throws(WormholeError) {
        guard !group.isEmpty, group.utf8.count <= 255,
            group.unicodeScalars.allSatisfy({
                $0.isASCII && ($0.properties.isAlphabetic || "0123456789.-_".unicodeScalars.contains($0))
            })
        else {
            throw WormholeError(
                .invalidIdentifier,
                "\"\(group)\" is not a group name: use 1 to 255 ASCII letters, digits, '.', '-' and '_', as in "
                    + "group.com.example.app."
            )
        }
    }
}
