import Dispatch
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization
import WormholeKit

/// The connections of one engine: calls borrow one, run their statements and give it back.
///
/// The engine's protocols are synchronous, so every call here blocks its thread until the server answers (or the
/// time-out passes). They run on the caller's thread, never on the event loop, which only moves bytes.
final class Connections: Sendable {
    /// The server: a location to open connections to, or a client to borrow them from.
    let source: ConnectionSource
    /// A client's server as it names itself (`postgres://user@host:port/database`, with what says it is a client's),
    /// once a connection was borrowed.
    private let clientServer: Locked<String?>
    /// SwiftNIO's shared event loops: never shut down, so that a connection closing late never finds its loop gone.
    var eventLoops: MultiThreadedEventLoopGroup { .singleton }
    let logger: Logger
    /// How long one statement may take before its connection is closed and the call fails.
    let timeout: Duration
    private let idle = Locked<[PooledConnection]>([])
    /// The client connections that engines of this process borrowed and prepared statements on, by identity, for
    /// every engine: a connection lent again, to this engine or another, keeps what was prepared on it, so each
    /// statement is prepared at most once per connection however many engines come and go. Closed ones are dropped.
    private static let borrowedStatements = Locked<[ObjectIdentifier: PooledConnection]>([:])
    /// Where the tasks that borrow a client's connections run.
    private let leaseExecutor = PostgresClientExecutor()
    /// Connections borrowed from a client, kept idle for a moment after a call.
    private let held = Locked<[BorrowedConnection]>([])
    /// Whether a sweep of ``held`` is due.
    private let sweepScheduled = Atomic<Bool>(false)
    /// How long a borrowed connection is kept idle before it goes back to its client.
    static let holdTime = Duration.milliseconds(100)
    /// At most this many borrowed connections are kept idle.
    private static let heldLimit = 2
    private let closed = Atomic<Bool>(false)
    private let nextID = Atomic<Int>(1)
    /// Settings of every connection's session (a store's `wormhole.author`), sent when it opens; on a client's
    /// connection, set when it is borrowed and set back to what they were when it is given back.
    let sessionParameters: [(String, String)]
    /// The statement that sets ``sessionParameters`` on a client's connection and returns what they were.
    private let settingSession: PostgresQuery?
    /// At most this many idle connections are kept; more are closed when given back.
    private static let idleLimit = 4

    /// Connections to `source`; `server` names it as another ``Connections`` of the same source learned to (a store's
    /// connections, from its engine's).
    init(
        source: ConnectionSource,
        timeout: Duration,
        logger: Logger,
        sessionParameters: [(String, String)] = [],
        server: String? = nil
    ) {
        self.source = source
        clientServer = Locked(server)
        self.timeout = timeout
        self.logger = logger
        self.sessionParameters = sessionParameters
        settingSession = Self.setting(sessionParameters, returningBefore: true)
    }

    // An engine released without being closed: what it kept of a client's goes back, as it was lent when this
    // engine changed no setting of its session, else closed (setting it back would need this object).
    deinit {
        let closing = !sessionParameters.isEmpty
        for each in held.withLock({ $0 }) { each.lease.giveBack(closing: closing || each.pooled.connection.isClosed) }
    }

    /// The error of a call on an engine that was closed.
    static let closedError = WormholeError(
        .serverUnavailable,
        "The PostgreSQL engine was closed: open a new one to go on."
    )

    /// Throws ``closedError`` once ``close()`` was called.
    private func ensureOpen() throws(WormholeError) {
        if closed.load(ordering: .relaxed) { throw Self.closedError }
    }

    /// What the server bounds itself on the engine's own connections, set (`set_config`) when each opens: a statement, and a wait
    /// for a lock, end on the server a little before the engine's time-out (100 and 200 ms), so that the server stops work
    /// the client gave up on (a client's time-out closes the connection, which a busy backend notices only when it
    /// next writes to it) and the connection stays usable (the error is SQLSTATE 57014 or 55P03); a session idle in a
    /// transaction ends after twice the time-out, and at least a minute (a store's transaction runs the caller's code
    /// between its statements). A time-out of a day or more sets nothing. Connections borrowed from a
    /// `PostgresClient` keep the settings the client's configuration gives them.
    static func serverTimeLimits(for timeout: Duration) -> [(String, String)] {
        let (seconds, attoseconds) = timeout.components
        guard seconds >= 0, seconds < 86_400 else { return [] }
        let milliseconds = seconds * 1_000 + attoseconds / 1_000_000_000_000_000
        let statement = max(100, milliseconds - 100)
        // A lock's wait a little shorter still, so that a statement held up by a lock says so.
        let lock = max(50, statement - 100)
        return [
            ("statement_timeout", "\(statement)"), ("lock_timeout", "\(lock)"),
            ("idle_in_transaction_session_timeout", "\(max(60_000, 2 * milliseconds))"),
        ]
    }

    /// The statement that sets `limits` for the session (names and values of ``serverTimeLimits(for:)``: names of
    /// settings and numbers, never the user's text), and `client_connection_check_interval` where the server has it.
    ///
    /// A connection this side closed at its time-out (postgres-nio cannot send a cancel request: it keeps the
    /// backend's key to itself) is then noticed by its backend within a second, which stops its statement, even one
    /// the server's own limits would let run. PostgreSQL 13 and older lack the setting, and a server whose platform
    /// cannot watch a socket refuses any value but 0: either way it is left out, in a block of its own.
    static func sessionLimitsStatement(_ limits: [(String, String)]) -> String {
        let calls = limits.map { "pg_catalog.set_config('\($0.0)', '\($0.1)', false)" }.joined(separator: ", ")
        return """
            DO $$ BEGIN
                PERFORM \(calls);
                BEGIN
                    PERFORM pg_catalog.set_config('client_connection_check_interval', '1000', false);
                EXCEPTION WHEN undefined_object OR invalid_parameter_value THEN NULL;
                END;
            END $$
            """
    }

    /// Opens a new connection, with ``sessionParameters`` and `parameters` set for its session.
    func connect(parameters: [(String, String)] = []) throws(WormholeError) -> PostgresConnection {
        try ensureOpen()
        guard case .location(let location) = source else {
            preconditionFailure("Connections of a client are borrowed, not opened.")
        }
        var configuration = location.configuration
        // The URL's `application_name`, when it has one, comes after ours: the server keeps the last. The time-out
        // is the URL's `connect_timeout`, else postgres-nio's 10 s.
        configuration.options.additionalStartupParameters =
            [("application_name", "wormhole")] + configuration.options.additionalStartupParameters
            + sessionParameters + parameters
        let id = nextID.add(1, ordering: .relaxed).oldValue
        let future = PostgresConnection.connect(
            on: eventLoops.next(),
            configuration: configuration,
            id: id,
            logger: logger
        )
        let connection: PostgresConnection
        do {
            connection = try wait(for: future, doing: "connecting to \(location)")
        } catch {
            // A connection that arrives after the time-out is closed, never left open.
            future.whenSuccess { $0.closeQuietly() }
            throw error
        }
        // Set once the session is open, not in the startup message: PgBouncer refuses startup parameters it does not
        // know, and these are among them. One round trip per new connection, which the pool keeps.
        let limits = Self.serverTimeLimits(for: timeout)
        if !limits.isEmpty {
            do throws(WormholeError) {
                try run(
                    PostgresQuery(unsafeSQL: Self.sessionLimitsStatement(limits)),
                    on: connection,
                    doing: "setting the session's time limits"
                )
            } catch {
                connection.closeQuietly()
                throw error
            }
        }
        return connection
    }

    /// Runs `body` with a connection of its own; a connection that failed is closed, not given back.
    func withConnection<Result>(
        _ body: (PostgresConnection) throws(WormholeError) -> Result
    ) throws(WormholeError) -> Result {
        try withPooledConnection { (pooled) throws(WormholeError) in try body(pooled.connection) }
    }

    private func withPooledConnection<Result>(
        _ body: (PooledConnection) throws(WormholeError) -> Result
    ) throws(WormholeError) -> Result {
        if case .client(let client) = source { return try withBorrowedConnection(from: client, body) }
        let reused = idle.withLock { idle in
            while let pooled = idle.popLast() {
                if !pooled.connection.isClosed { return Optional(pooled) }
            }
            return nil
        }
        let pooled: PooledConnection
        if let reused { pooled = reused } else { pooled = PooledConnection(try connect()) }
        do throws(WormholeError) {
            let result = try body(pooled)
            giveBack(pooled)
            return result
        } catch {
            if error.code == .serverUnavailable || pooled.connection.isClosed {
                pooled.connection.closeQuietly()
            } else {
                giveBack(pooled)
            }
            throw error
        }
    }

    /// Runs `body` with a connection borrowed from `client`, its session set up for this engine.
    ///
    /// The connection is kept, idle, for ``holdTime`` after the call (at most ``heldLimit`` of them), so that a burst
    /// of calls borrows once: borrowing costs a task and three thread hops, about as much as a statement on one CPU.
    /// Then it goes back to the client as it was lent: with the session reset, or closed when it failed (the client
    /// then replaces it).
    private func withBorrowedConnection<Result>(
        from client: PostgresClient,
        _ body: (PooledConnection) throws(WormholeError) -> Result
    ) throws(WormholeError) -> Result {
        try ensureOpen()
        let borrowed: BorrowedConnection
        if let kept = heldConnection() { borrowed = kept } else { borrowed = try borrow(from: client) }
        let result: Swift.Result<Result, WormholeError>
        do throws(WormholeError) {
            result = .success(try body(borrowed.pooled))
        } catch {
            result = .failure(error)
        }
        if case .failure(let error) = result, error.code == .serverUnavailable {
            borrowed.lease.giveBack(closing: true)
        } else {
            hold(borrowed)
        }
        return try result.get()
    }

    /// A borrowed connection kept idle, if one is (and is open).
    private func heldConnection() -> BorrowedConnection? {
        while let kept = held.withLock({ $0.popLast() }) {
            if !kept.pooled.connection.isClosed { return kept }
            kept.lease.giveBack(closing: true)
        }
        return nil
    }

    /// How errors and logs name the server: its location, or what a client's server says of itself.
    var server: String { clientServer.withLock { $0 } ?? source.description }

    /// A client's server as it named itself, once a connection was borrowed; nil before, and for a location.
    var learnedServer: String? { clientServer.withLock { $0 } }

    /// Borrows a connection from `client` and, the first time, asks its server what it is, for ``server``.
    private func lease(
        from client: PostgresClient,
        doing what: String
    ) throws(WormholeError) -> (PostgresConnection, ClientLease) {
        let (connection, lease) = try ClientLease.borrow(
            from: client,
            on: leaseExecutor,
            within: waitLimit,
            server: server,
            doing: what
        )
        guard learnedServer == nil else { return (connection, lease) }
        do throws(WormholeError) {
            // The login role, not one a `SET ROLE` of the app's put on: the one the client's configuration names.
            let rows = try run(
                """
                SELECT session_user::text, pg_catalog.current_database()::text,
                    pg_catalog.host(pg_catalog.inet_server_addr()), pg_catalog.inet_server_port()
                """,
                on: connection,
                doing: "\(what) (naming the server)"
            )
            if let (user, database, host, port) = try? rows.first?.decode((String, String, String?, Int32?).self) {
                clientServer.withLock { $0 = Self.clientServerName(user, database, host, port) }
            }
        } catch {
            lease.giveBack(closing: true)
            throw error
        }
        return (connection, lease)
    }

    /// `postgres://user@host:port/database`, and that it is reached through a client; a server reached over a Unix
    /// socket has no address.
    static func clientServerName(_ user: String, _ database: String, _ host: String?, _ port: Int32?) -> String {
        guard let host else {
            return "postgres://\(user)@/\(database) (through a PostgresClient, over a Unix socket)"
        }
        let address = host.contains(":") ? "[\(host)]" : host
        return "postgres://\(user)@\(address)\(port.map { ":\($0)" } ?? "")/\(database) (through a PostgresClient)"
    }

    /// Borrows a connection and sets its session up.
    private func borrow(from client: PostgresClient) throws(WormholeError) -> BorrowedConnection {
        let (connection, lease) = try lease(from: client, doing: "borrowing a connection")
        let before = try setUp(
            settingSession,
            count: sessionParameters.count,
            on: connection,
            of: lease,
            doing: "setting up the session"
        )
        return BorrowedConnection(
            pooled: pooledConnection(borrowing: connection),
            lease: lease,
            settingsBefore: before,
            idleSince: .now
        )
    }

    /// Keeps `borrowed` idle for the next call, or gives it back when enough are kept.
    private func hold(_ borrowed: BorrowedConnection) {
        var borrowed = borrowed
        borrowed.idleSince = .now
        let kept = held.withLock { held in
            guard !closed.load(ordering: .relaxed), held.count < Self.heldLimit else { return false }
            held.append(borrowed)
            return true
        }
        guard kept else {
            giveBack(borrowed)
            return
        }
        scheduleSweep()
    }

    /// Sweeps the kept connections after ``holdTime``, unless a sweep is already due.
    private func scheduleSweep() {
        guard !sweepScheduled.exchange(true, ordering: .relaxed) else { return }
        DispatchQueue.global().asyncAfter(deadline: .now() + Self.holdTime.dispatchInterval) { [weak self] in
            self?.sweep()
        }
    }

    /// Gives back the connections kept idle for ``holdTime``; comes again while any is kept.
    private func sweep() {
        // Cleared first: a connection kept while this sweep gives others back schedules the next sweep itself.
        sweepScheduled.store(false, ordering: .relaxed)
        let now = ContinuousClock.now
        let (due, more) = held.withLock { held in
            let due = held.filter { now - $0.idleSince >= Self.holdTime }
            held.removeAll { now - $0.idleSince >= Self.holdTime }
            return (due, !held.isEmpty)
        }
        for each in due { giveBack(each) }
        if more { scheduleSweep() }
    }

    /// Gives `borrowed` back to its client as it was lent (no call leaves a transaction open: a store's `read` rolls
    /// back one its closure left), with the settings this engine changed set back to what they were; closed when
    /// that fails. Its prepared statements stay, for the next engine of this process it is lent to.
    private func giveBack(_ borrowed: BorrowedConnection) {
        let connection = borrowed.pooled.connection
        var closing = connection.isClosed
        if !closing {
            do throws(WormholeError) {
                try restore(sessionParameters, to: borrowed.settingsBefore, on: connection)
            } catch {
                closing = true
            }
        }
        borrowed.lease.giveBack(closing: closing)
    }

    /// Gives back every connection kept idle, on a thread that may wait for the server (not the caller's).
    private func giveBackHeld() {
        let kept = held.withLock { held in
            defer { held.removeAll() }
            return held
        }
        guard !kept.isEmpty else { return }
        DispatchQueue.global().async { [self] in
            for each in kept { giveBack(each) }
        }
    }

    /// The statements prepared on a client's connection: known when an engine of this process borrowed it before.
    private func pooledConnection(borrowing connection: PostgresConnection) -> PooledConnection {
        Self.borrowedStatements.withLock { borrowed in
            if let known = borrowed[ObjectIdentifier(connection)] { return known }
            Self.forgetClosed(&borrowed)
            let pooled = PooledConnection(connection)
            borrowed[ObjectIdentifier(connection)] = pooled
            return pooled
        }
    }

    /// Drops the connections a client closed: they will not be lent again, and what was prepared on them went with
    /// them. (Kept, they would keep their objects alive for nothing.)
    private static func forgetClosed(_ borrowed: inout [ObjectIdentifier: PooledConnection]) {
        borrowed = borrowed.filter { !$0.value.connection.isClosed }
    }

    /// A connection for the long run, with `parameters` set for its session: the hub's listening connection, opened
    /// for the purpose or borrowed from the client.
    ///
    /// Its `end` closes one this engine opened. One borrowed goes back to the client, when it ends cleanly (the hub has
    /// stopped its listeners, whose `UNLISTEN`s postgres-nio sends, and released its lock), with its settings set back
    /// to what they were: as it was lent. Closing it instead would cost the client a new connection, and
    /// postgres-nio's pool does not open one for a request that waits while a lent connection closes: that request
    /// would wait for the next connection given back.
    func dedicatedConnection(parameters: [(String, String)]) throws(WormholeError) -> DedicatedConnection {
        guard case .client(let client) = source else {
            let connection = try connect(parameters: parameters)
            return DedicatedConnection(connection: connection) { _ in connection.closeQuietly() }
        }
        try ensureOpen()
        let (connection, lease) = try lease(from: client, doing: "borrowing the listening connection")
        let settings = sessionParameters + parameters
        let before = try setUp(
            Self.setting(settings, returningBefore: true),
            count: settings.count,
            on: connection,
            of: lease,
            doing: "setting up the listening session"
        )
        return DedicatedConnection(connection: connection) { [self] cleanly in
            guard cleanly, !connection.isClosed else {
                lease.giveBack(closing: true)
                return
            }
            do throws(WormholeError) {
                try restore(settings, to: before, on: connection)
                lease.giveBack(closing: false)
            } catch {
                lease.giveBack(closing: true)
            }
        }
    }

    /// Runs `setting` (made with `returningBefore`) on `connection`, and returns the `count` values it read first;
    /// when that fails, `lease` goes back closed.
    private func setUp(
        _ setting: PostgresQuery?,
        count: Int,
        on connection: PostgresConnection,
        of lease: ClientLease,
        doing what: String
    ) throws(WormholeError) -> [String?] {
        guard let setting else { return [] }
        do throws(WormholeError) {
            let rows = try run(setting, on: connection, doing: what)
            guard let row = rows.first else {
                throw WormholeError(.serverRejected, "PostgreSQL returned no row while \(what).")
            }
            let cells = row.makeRandomAccess()
            var before: [String?] = []
            for index in 0..<count {
                do {
                    before.append(try cells[index].decode(String?.self))
                } catch {
                    throw WormholeError(
                        .serverRejected,
                        "PostgreSQL returned a setting that does not decode: \(error).",
                        underlyingError: SendableDescription(error)
                    )
                }
            }
            return before
        } catch {
            lease.giveBack(closing: true)
            throw error
        }
    }

    /// Sets `parameters` back to the values `before` (one never set, to an empty text).
    private func restore(
        _ parameters: [(String, String)],
        to before: [String?],
        on connection: PostgresConnection
    ) throws(WormholeError) {
        guard let restoring = Self.setting(zip(parameters, before).map { ($0.0, $1 ?? "") }, returningBefore: false)
        else { return }
        try run(restoring, on: connection, doing: "resetting the session")
    }

    /// The statement that sets `parameters` for the session, returning first what each was (NULL when never set)
    /// when `returningBefore`; nil for none.
    private static func setting(_ parameters: [(String, String)], returningBefore: Bool) -> PostgresQuery? {
        guard !parameters.isEmpty else { return nil }
        var binds = PostgresBindings()
        var before: [String] = []
        var calls: [String] = []
        for (name, value) in parameters {
            binds.append(name)
            binds.append(value)
            let (name, value) = ("$\(binds.count - 1)", "$\(binds.count)")
            before.append("pg_catalog.current_setting(\(name), true) AS v\(before.count)")
            calls.append("pg_catalog.set_config(\(name), \(value), false)")
        }
        guard returningBefore else {
            return PostgresQuery(unsafeSQL: "SELECT " + calls.joined(separator: ", "), binds: binds)
        }
        // Materialized, the values are read before any is set.
        let columns = before.indices.map { "before.v\($0)" }
        return PostgresQuery(
            unsafeSQL: "WITH before AS MATERIALIZED (SELECT \(before.joined(separator: ", "))) SELECT "
                + (columns + calls).joined(separator: ", ") + " FROM before",
            binds: binds
        )
    }

    private func giveBack(_ pooled: PooledConnection) {
        let kept = idle.withLock { idle in
            guard !closed.load(ordering: .relaxed), idle.count < Self.idleLimit, !pooled.connection.isClosed else {
                return false
            }
            idle.append(pooled)
            return true
        }
        if !kept { pooled.connection.closeQuietly() }
    }

    /// Runs one statement (in a transaction of its own) and returns its rows once that transaction has committed.
    ///
    /// The server commits a statement outside a transaction block at the Sync that postgres-nio sends after it, and
    /// sends the statement's end (which completes postgres-nio's future) only then, with what it kept in its output
    /// buffer: a write never returns before it is durable and visible to other connections. A test holds to this
    /// (`PostgresCommitTests`).
    @discardableResult
    func query(_ query: PostgresQuery, doing what: @autoclosure () -> String) throws(WormholeError) -> [PostgresRow] {
        try withConnection { (connection) throws(WormholeError) in
            try run(query, on: connection, doing: what())
        }
    }

    /// Runs one of the statements on the paths of messages (in a transaction of its own) and returns its rows once
    /// that transaction has committed, as ``query(_:doing:)`` does.
    ///
    /// The statement is prepared on each pooled connection the first time that connection runs it (a named prepared
    /// statement), and then only bound and executed: the server neither parses nor plans it again, which on these
    /// short statements costs about as much as running them. `binds` holds a value of each parameter's type, in
    /// order.
    @discardableResult
    func execute(
        _ statement: PreparedStatement,
        _ binds: [PostgresData],
        doing what: @autoclosure () -> String
    ) throws(WormholeError) -> [PreparedRow] {
        try withPooledConnection { (pooled) throws(WormholeError) in
            var attempt = 1
            while true {
                let prepared: PreparedQuery
                if let known = pooled.prepared.withLock({ $0[statement.sql] }) {
                    prepared = known
                } else {
                    prepared = try wait(
                        for: pooled.connection.prepare(query: statement.sql),
                        doing: what(),
                        closing: pooled.connection
                    )
                    pooled.prepared.withLock { $0[statement.sql] = prepared }
                }
                switch try outcome(of: prepared.execute(binds), doing: what(), closing: pooled.connection) {
                case .success(let rows): return rows.map(PreparedRow.init(row:))
                case .failure(let error):
                    // The server could not run the statement as prepared: a migration changed what it returns
                    // (0A000, "cached plan must not change result type"), or the session lost it (26000, after a
                    // pooler's DISCARD ALL). Nothing of it ran: prepared again, it runs once more. Any other refusal
                    // leaves the statement prepared, for the next call.
                    let state = Self.sqlState(of: error)
                    if attempt == 1, state == "0A000" || state == "26000" {
                        attempt += 1
                        pooled.prepared.withLock { $0[statement.sql] = nil }
                        _ = prepared.deallocate()  // closing a statement the server lost is not an error
                        continue
                    }
                    throw Self.wormholeError(error, doing: what(), server: server)
                }
            }
        }
    }

    /// Runs one statement on `connection` and returns its rows.
    @discardableResult
    func run(
        _ query: PostgresQuery,
        on connection: PostgresConnection,
        doing what: @autoclosure () -> String
    ) throws(WormholeError) -> [PostgresRow] {
        let result = try wait(for: connection.query(query, logger: logger), doing: what(), closing: connection)
        return Array(result.rows)
    }

    /// Runs `body` in a transaction on one connection: committed when it returns, rolled back when it throws.
    func transaction<Result>(
        doing what: @autoclosure () -> String,
        _ body: (PostgresConnection) throws(WormholeError) -> Result
    ) throws(WormholeError) -> Result {
        let what = what()
        return try withConnection { (connection) throws(WormholeError) in
            try run("BEGIN", on: connection, doing: what)
            let result: Result
            do throws(WormholeError) {
                result = try body(connection)
            } catch {
                if !connection.isClosed { _ = try? run("ROLLBACK", on: connection, doing: what) }
                throw error
            }
            try run("COMMIT", on: connection, doing: what)
            return result
        }
    }

    /// Sends a statement without waiting for it; a failure is logged.
    func submit(_ query: PostgresQuery, doing what: String) {
        submit(doing: what) { () throws(WormholeError) in try self.query(query, doing: what) }
    }

    /// Runs a prepared statement without waiting for it; a failure is logged.
    func submit(_ statement: PreparedStatement, _ binds: [PostgresData], doing what: String) {
        submit(doing: what) { () throws(WormholeError) in try self.execute(statement, binds, doing: what) }
    }

    private func submit(doing what: String, _ body: @escaping @Sendable () throws(WormholeError) -> Void) {
        let logger = logger
        DispatchQueue.global().async {
            do throws(WormholeError) {
                try body()
            } catch {
                logger.warning("PostgreSQL engine: \(what) failed: \(error)")
            }
        }
    }

    /// The time-out of a call that waits on the server within this scope (a live request's), and when it started:
    /// every wait below it, connecting and statements alike, ends by then even when the engine's ``timeout`` is
    /// longer. Bound with `Connections.$callTimeLimit.withValue(…)` around the call.
    @TaskLocal static var callTimeLimit: (start: ContinuousClock.Instant, timeout: Duration)?

    /// The longest the next wait may take: the engine's ``timeout``, or the time left of the call's own.
    var waitLimit: Duration {
        // Subtracted, never added to a clock reading: a call's time-out of `.seconds(Int64.max)` must not trap.
        guard let limit = Self.callTimeLimit else { return timeout }
        return max(.zero, min(timeout, limit.timeout - limit.start.duration(to: .now)))
    }

    /// Waits for `future` on this thread, at most ``waitLimit``; on time-out, `connection` is closed.
    func wait<Value: Sendable>(
        for future: EventLoopFuture<Value>,
        doing what: @autoclosure () -> String,
        closing connection: PostgresConnection? = nil
    ) throws(WormholeError) -> Value {
        switch try outcome(of: future, doing: what(), closing: connection) {
        case .success(let value): return value
        case .failure(let error): throw Self.wormholeError(error, doing: what(), server: server)
        }
    }

    /// Waits for `future` on this thread, at most ``waitLimit``, and returns postgres-nio's outcome as it is; throws only
    /// when the time-out passes, after closing `connection`.
    private func outcome<Value: Sendable>(
        of future: EventLoopFuture<Value>,
        doing what: @autoclosure () -> String,
        closing connection: PostgresConnection?
    ) throws(WormholeError) -> Result<Value, any Error> {
        let done = DispatchSemaphore(value: 0)
        let completed = Locked<Result<Value, any Error>?>(nil)
        future.whenComplete { result in
            completed.withLock { $0 = result }
            done.signal()
        }
        let limit = waitLimit
        if done.wait(timeout: .now() + limit.dispatchInterval) == .timedOut {
            connection?.closeQuietly()
            throw WormholeError(
                .serverUnavailable,
                "The PostgreSQL server \(server) did not answer within \(limit) while \(what()); the connection "
                    + "was closed. A write may or may not have happened."
            )
        }
        return completed.withLock({ $0 })!
    }

    /// The SQLSTATE of the server's refusal, from either of postgres-nio's errors; nil for any other failure.
    static func sqlState(of error: any Error) -> String? { refusal(of: error)?.state }

    /// The server's refusal: as a `PSQLError`, or, from the calls of prepared statements (`PreparedQuery`), as the
    /// older `PostgresError` that postgres-nio turns it into there; nil for any other failure.
    private static func refusal(of error: any Error) -> (state: String, message: String)? {
        if let error = error as? PSQLError, error.code == .server, let info = error.serverInfo {
            return (info[.sqlState] ?? "", info[.message] ?? "no message")
        }
        if case .server(let response) = error as? PostgresError {
            return (response.fields[.sqlState] ?? "", response.fields[.message] ?? "no message")
        }
        return nil
    }

    /// The ``WormholeError`` for an error of postgres-nio: the server's refusal, or a connection that failed.
    static func wormholeError(_ error: any Error, doing what: String, server: String) -> WormholeError {
        if let (state, message) = refusal(of: error) {
            var advice = ""
            switch state {
            case "42P01", "3F000", "42883": advice = " Set up the schema with `wormhole postgres setup --postgres URL`."
            case "42501":
                advice = " This role may not use the group: grant it with `wormhole postgres grant --group G --role R`."
            case "28P01": advice = " Check the user and password of the URL."
            case "28000":
                advice = " The server's pg_hba.conf refuses this connection: check the user, the host and sslmode."
            case "57014":
                advice = " It ran past the engine's time-out, and the server ended it (statement_timeout); try again."
            case "55P03":
                advice = " Another session held a lock it needed for longer than the engine's time-out (lock_timeout)."
            default: break
            }
            let code: WormholeError.Code =
                state.hasPrefix("28") || state.hasPrefix("57") || state.hasPrefix("08") || state == "55P03"
                ? .serverUnavailable : .serverRejected
            return WormholeError(
                code,
                "The PostgreSQL server \(server) refused \(what): \(message) (SQLSTATE \(state)).\(advice)",
                underlyingError: SendableDescription(error)
            )
        }
        guard let error = error as? PSQLError else {
            return WormholeError(
                .serverUnavailable,
                "The PostgreSQL server \(server) could not be reached while \(what): \(error).",
                underlyingError: SendableDescription(error)
            )
        }
        // The cause underneath (a refused connection, a certificate that does not verify) says what to fix.
        let cause = error.underlying.map { ": \($0)" } ?? ""
        let advice =
            cause.contains("CERTIFICATE_VERIFY_FAILED")
            ? " The server's certificate is not signed by an authority this URL trusts (sslrootcert, or the system's), "
                + "or, with verify-full, not for its host name: check sslrootcert and the host."
            : ""
        return WormholeError(
            .serverUnavailable,
            "The connection to the PostgreSQL server failed while \(what) (\(error.code)\(cause)).\(advice)",
            underlyingError: SendableDescription(error)
        )
    }

    /// Closes every idle connection (a client's go back to it); later calls fail.
    func close() {
        guard !closed.exchange(true, ordering: .relaxed) else { return }
        giveBackHeld()
        Self.borrowedStatements.withLock { Self.forgetClosed(&$0) }
        let pooled = idle.withLock { idle in
            defer { idle.removeAll() }
            return idle
        }
        for each in pooled { each.connection.closeQuietly() }
    }
}

/// A statement on the paths of messages, run with ``Connections/execute(_:_:doing:)``: prepared once on each
/// connection that runs it. Its parameters are `$1`, `$2`, …, each cast to its type, so that what the server infers
/// is what the binds hold.
struct PreparedStatement: Sendable {
    let sql: String

    /// A hint (`n…`): the group, the channel's suffix (empty: the group's channel, as its row names it now) and the
    /// text.
    static let notifyHint = PreparedStatement(sql: "SELECT wormhole.notify($1::text, $2::text, $3::text)")

    /// A sealed notification (``NotificationSeal``): the group, the channel's suffix and the text.
    static let notifySealed = PreparedStatement(sql: "SELECT wormhole.notify_sealed($1::text, $2::text, $3::text)")
}

/// A row of a prepared statement's result, read column by column with ``columns()``.
///
/// postgres-nio asks for every column in binary, but the row description its `PreparedQuery` keeps is the one the
/// server gave when the statement was prepared, which says text: decoded through it, a `bigint` fails. The cells read
/// here say binary, which is what came.
struct PreparedRow: Sendable {
    let row: PostgresRow

    /// The columns, from the first.
    func columns() -> Columns { Columns(cells: row.makeIterator()) }

    /// The columns of a row, decoded in order.
    struct Columns {
        var cells: PostgresRow.Iterator

        /// The next column as `type`.
        mutating func decode<Value: PostgresDecodable>(_ type: Value.Type) throws -> Value {
            guard var cell = cells.next() else {
                throw WormholeError(.serverRejected, "PostgreSQL returned fewer columns than expected.")
            }
            cell.format = .binary
            return try cell.decode(Value.self)
        }
    }
}

/// A connection of the pool, and the statements prepared on it (by their text).
final class PooledConnection: Sendable {
    let connection: PostgresConnection
    /// One borrower at a time uses it; the lock makes it `Sendable`.
    let prepared = Locked<[String: PreparedQuery]>([:])

    init(_ connection: PostgresConnection) {
        self.connection = connection
    }
}

/// A connection borrowed from a client: its prepared statements, its lease, the values of the session settings
/// this engine changed as they were before (nil: never set), and since when it is idle.
private struct BorrowedConnection: Sendable {
    let pooled: PooledConnection
    let lease: ClientLease
    let settingsBefore: [String?]
    var idleSince: ContinuousClock.Instant
}

/// A connection held for the long run, and how to end it: closing it, or giving it back to its client closed.
struct DedicatedConnection: Sendable {
    let connection: PostgresConnection
    /// Ends the connection's use: closes it, or, when `cleanly` (the engine closing while the connection works, its
    /// listeners stopped and its lock released), gives it back to the client it was borrowed from, with its settings
    /// set back.
    let end: @Sendable (_ cleanly: Bool) -> Void
}

/// An error kept by its description: postgres-nio's errors hold the query, whose binds must not travel.
struct SendableDescription: Error, Sendable, CustomStringConvertible {
    let description: String
    init(_ error: any Error) { description = String(describing: error) }
}

extension PostgresConnection {
    /// Closes the connection without waiting (postgres-nio's `close()` has an async overload too).
    /// The connection stays referenced until it is closed: postgres-nio asserts that none is released open.
    func closeQuietly() {
        let closing: EventLoopFuture<Void> = close()
        closing.whenComplete { _ in withExtendedLifetime(self) {} }
    }
}

extension Duration {
    /// The duration for Dispatch's waits, to the nanosecond.
    var dispatchInterval: DispatchTimeInterval {
        .nanoseconds(Int(components.seconds) * 1_000_000_000 + Int(components.attoseconds / 1_000_000_000))
    }

    /// The duration in seconds, for SQL's intervals and Foundation's sleeps.
    var secondsValue: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
