import Foundation
import Logging
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholePostgres

/// `PostgresEngine(client:group:)` borrows its connections from a `PostgresClient` the app runs: it must work as the
/// engine on its own connections does (the contract suites run it too, as `postgresClient`), give back connections
/// as it found them (no `LISTEN`, lock, transaction or session setting left behind), and say what is wrong when the
/// client lends nothing.
@Suite(
    "PostgreSQL engine on a PostgresClient",
    .slow("needs a PostgreSQL server (and some, network namespaces)"),
    .enabled(if: LocalPostgresServer.unavailableReason() == nil, "PostgreSQL is not installed"),
    .limit(minutes: 3)
)
struct PostgresClientEngineTests {
    /// A client of the test server whose pool holds at most `connections`, not yet running.
    private func client(connections: Int = 20) throws -> PostgresClient {
        var configuration = try PostgresLocation(url: try requireTestServerURL()).plainClientConfiguration()
        configuration.options.maximumConnections = connections
        configuration.options.minimumConnections = 0
        // Kept while a test waits its turn for a thread (offThePool): a connection the test set up must stay.
        configuration.options.connectionIdleTimeout = .seconds(3600)
        return PostgresClient(configuration: configuration, backgroundLogger: Logger(label: "tests.client"))
    }

    /// Runs `body` with a client of the test server (its pool holding at most `connections`) whose `run()` goes on
    /// meanwhile, on ``PostgresClientExecutor/shared`` as the engine's documentation says; `body` may add tasks of its
    /// own to the group, which are cancelled with the client's when it returns.
    private func withRunningClient(
        connections: Int = 20,
        _ body: (PostgresClient, inout ThrowingDiscardingTaskGroup<any Error>) async throws -> Void
    ) async throws {
        let client = try client(connections: connections)
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            defer { tasks.cancelAll() }
            try await body(client, &tasks)
        }
    }

    @Test("Made with the public initializer while the client runs, it passes queue messages to an engine of its own")
    func worksWithAnEngineOfItsOwn() async throws {
        let group = uniqueGroup("client")
        try await withRunningClient { client, _ in
            let engine = try await PostgresEngine(client: client, group: group)
            defer { engine.close() }
            try await offThePool {
                // Errors and logs name the client's server as the server names itself (the client does not say).
                let rows = try engine.core.connections.query(
                    """
                    SELECT session_user::text, current_database()::text, host(inet_server_addr()), inet_server_port()
                    """,
                    doing: "naming the server"
                )
                let (user, database, host, port) = try #require(rows.first).decode(
                    (String, String, String?, Int32?).self
                )
                let name = Connections.clientServerName(user, database, host, port)
                #expect(name.hasPrefix("postgres://\(user)@"), "\(name)")
                #expect(engine.description == "PostgreSQL \(name) group \(group)")
                let refused = #expect(throws: WormholeError.self) {
                    try engine.core.connections.query("SELECT no_such_column", doing: "testing")
                }
                #expect(
                    refused?.message.hasPrefix("The PostgreSQL server \(name) refused testing") == true,
                    "\(String(describing: refused))"
                )
                let borrowing = Wormhole(engine: engine, sender: "borrowing")
                let owning = try PostgresEngine(url: try requireTestServerURL(), group: group)
                defer { owning.close() }
                let other = Wormhole(engine: owning, sender: "owning")
                let received = Locked<[String]>([])
                let consumer = try other.queue("jobs").consume(consumer: "worker", as: String.self) { message in
                    received.withLock { $0.append(message.value) }
                }
                defer { consumer.cancel() }
                for index in 0..<20 { try borrowing.queue("jobs").enqueue("job \(index)") }
                #expect(eventually { received.withLock { $0.count } == 20 })
                #expect(received.withLock { $0 } == (0..<20).map { "job \($0)" })
                // And the other way: a mailbox listener on the borrowing engine.
                let latest = Locked<String?>(nil)
                let listener = try borrowing.listenForMessage(withIdentifier: "status", as: String.self) { value in
                    latest.withLock { $0 = value }
                }
                defer { listener.cancel() }
                try other.passMessageObject("ready", identifier: "status")
                #expect(eventually { latest.withLock { $0 } == "ready" })
            }
        }
    }

    @Test("Connections go back as lent: the engine's LISTENs, lock and transaction gone, the app's own kept")
    func givesConnectionsBackClean() async throws {
        let group = uniqueGroup("client")
        let schema = "s\(UInt32.random(in: 0...UInt32.max))"
        // Two connections: one the engine listens on while it is open, one for every call.
        try await withRunningClient(connections: 2) { client, _ in
            // The app's own session settings, a channel it listens on and a lock it holds, on both of the client's
            // connections: the engine must leave them be.
            try await client.withConnection { first in
                try await client.withConnection { second in
                    for connection in [first, second] {
                        _ = try await connection.query(
                            """
                            SELECT pg_catalog.set_config('wormhole.author', 'app-code', false),
                                pg_catalog.set_config('tcp_keepalives_idle', '77', false),
                                pg_catalog.pg_advisory_lock_shared(42)
                            """,
                            logger: Logger(label: "tests")
                        )
                        _ = try await connection.query("LISTEN app_channel", logger: Logger(label: "tests"))
                    }
                }
            }
            let engine = try await PostgresEngine(client: client, group: group)
            let (listeningBackend, storeBackend) = try await offThePool {
                // Listening first, so that the engine's listening connection is not the one the store then uses.
                let wormhole = Wormhole(engine: engine, sender: "borrowing")
                let listener = try wormhole.listenForMessage(withIdentifier: "status", as: String.self) { _ in }
                try wormhole.passMessageObject("ready", identifier: "status")
                // A live listener too: its channel, and the advisory lock that says this process lives.
                let live = try wormhole.listenForLiveMessageData(withIdentifier: "ping") { _ in }
                let store = try PostgresStore(
                    engine: engine,
                    name: "notes",
                    schema: schema,
                    migrations: [
                        .init("v1", sql: "CREATE SCHEMA \(schema)", "CREATE TABLE note (id bigint PRIMARY KEY)")
                    ],
                    configuration: .init(author: "borrower")
                )
                // Unqualified, the table is the store's: the search path is set for each call.
                try store.write { connection in try connection.query("INSERT INTO note VALUES (1)") }
                let author = try store.transactions().last?.author
                #expect(author == "borrower")
                // A read that opens a transaction and leaves it open: the connection must not go back inside it.
                let storeBackend = try store.read { connection in
                    try connection.query("BEGIN")
                    return try #require(try connection.query("SELECT pg_catalog.pg_backend_pid()").first)
                        .decode(Int32.self)
                }
                listener.cancel()
                live.cancel()
                store.close()
                return (try engine.core.hub.listeningBackend(), storeBackend)
            }
            #expect(listeningBackend != storeBackend)
            engine.close()
            // Both connections go back (the listening one once its thread has ended its session, the store's once
            // the store is closed or it has been idle a moment), as they were lent: the app takes both at once (the
            // second wait ends when the last comes back).
            let checking = Task {
                try await client.withConnection { first in
                    try await client.withConnection { second in
                        var seen: Set<Int32> = []
                        for connection in [first, second] {
                            seen.insert(try await Self.checkClean(connection, schema: schema))
                        }
                        return seen
                    }
                }
            }
            let seen = try #require(await result(of: checking, within: 20), "not given back within 20 s").get()
            #expect(seen == [listeningBackend, storeBackend])
        }
    }

    @Test("Closing the engine serves a request the app made while the client's pool was used up")
    func closingServesAWaitingRequest() async throws {
        // Two connections: the engine listens on one, the app holds the other; the app's next request waits.
        try await withRunningClient(connections: 2) { client, tasks in
            let engine = try await PostgresEngine(client: client, group: uniqueGroup("client"))
            try await offThePool { _ = try engine.core.hub.listeningBackend() }
            let holding = AsyncStream<Void>.makeStream()
            let release = AsyncStream<Void>.makeStream()
            let served = Locked(false)
            tasks.addTask {
                try await client.withConnection { _ in
                    holding.continuation.yield()
                    for await _ in release.stream { break }
                }
            }
            for await _ in holding.stream { break }
            tasks.addTask {
                try await client.withConnection { connection in
                    _ = try await connection.query("SELECT 1", logger: Logger(label: "tests"))
                    served.withLock { $0 = true }
                }
            }
            try await Task.sleep(for: .milliseconds(200))
            #expect(!served.withLock { $0 })
            engine.close()
            // The listening connection goes back to the pool, which lends it to the request waiting: closed instead,
            // it would leave the request waiting for the app's own connection (postgres-nio opens no new one then).
            let deadline = ContinuousClock.now + .seconds(10)
            while !served.withLock({ $0 }), ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(served.withLock { $0 })
            release.continuation.finish()
        }
    }

    /// Checks that `connection` is as the app left it, and returns its backend.
    private static func checkClean(_ connection: PostgresConnection, schema: String) async throws -> Int32 {
        let rows = try await connection.query(
            """
            SELECT pg_catalog.pg_backend_pid(), pg_catalog.current_setting('search_path'),
                coalesce(pg_catalog.current_setting('wormhole.author', true), ''),
                pg_catalog.current_setting('tcp_keepalives_idle'),
                (SELECT coalesce(pg_catalog.string_agg(c, ','), '') FROM pg_catalog.pg_listening_channels() AS c),
                (SELECT count(*) FROM pg_catalog.pg_locks
                    WHERE pid = pg_catalog.pg_backend_pid() AND locktype = 'advisory'),
                pg_catalog.pg_current_xact_id()::text
            """,
            logger: Logger(label: "tests")
        )
        var backend: Int32 = 0
        for try await (pid, searchPath, author, keepAlive, channels, locks, transaction) in rows.decode(
            (Int32, String, String, String, String, Int64, String).self
        ) {
            backend = pid
            #expect(!searchPath.contains(schema))
            #expect(author == "app-code")
            #expect(keepAlive == "77")
            // The app's, and only the app's: the engine's own are gone.
            #expect(channels == "app_channel")
            #expect(locks == 1)
            // Outside a transaction, each statement has one of its own.
            let next = try await connection.query(
                "SELECT pg_catalog.pg_current_xact_id()::text",
                logger: Logger(label: "tests")
            )
            for try await nextTransaction in next.decode(String.self) { #expect(nextTransaction != transaction) }
        }
        return backend
    }

    private static func count(_ query: PostgresQuery, _ client: PostgresClient) async throws -> Int64 {
        try await client.withConnection { connection in
            var total: Int64 = 0
            for try await count in try await connection.query(query, logger: Logger(label: "tests")).decode(Int64.self)
            {
                total += count
            }
            return total
        }
    }

    @Test("A statement is prepared once on a borrowed connection, and not again when the client lends it again")
    func preparesOncePerBorrowedConnection() async throws {
        let group = uniqueGroup("client")
        // Two connections: the listening one, and the one every call borrows.
        try await withRunningClient(connections: 2) { client, _ in
            let engine = try await PostgresEngine(client: client, group: group)
            defer { engine.close() }
            try await offThePool {
                _ = try engine.core.hub.listeningBackend()
                let count = PreparedStatement(sql: "SELECT count(*) FROM pg_catalog.pg_prepared_statements")
                func prepared() throws -> (count: Int64, backend: Int32) {
                    let rows = try engine.core.connections.execute(count, [], doing: "counting")
                    let backend = try engine.core.connections.query("SELECT pg_catalog.pg_backend_pid()", doing: "")
                    return (
                        try decode(Int64.self, rows.first, doing: "counting"),
                        try decode(Int32.self, backend.first, doing: "reading the backend")
                    )
                }
                let first = try prepared()
                #expect(try prepared().count == first.count)
                // Kept idle longer than the engine keeps it, the connection goes back to the client, which lends it
                // again: the statement is still prepared there, and known to be.
                Thread.sleep(forTimeInterval: 3 * Connections.holdTime.secondsValue)
                let again = try prepared()
                #expect(again.backend == first.backend)
                #expect(again.count == first.count)
            }
        }
    }

    @Test("Engines opened and closed one after another on a client leave at most one of each statement prepared")
    func preparedStatementsDoNotPileUp() async throws {
        // One connection for calls, one for listening: every engine borrows the same two.
        let group = uniqueGroup("client")
        try await withRunningClient(connections: 2) { client, _ in
            var counts: [Int64] = []
            for round in 0..<4 {
                let engine = try await PostgresEngine(client: client, group: group)
                try await offThePool {
                    let wormhole = Wormhole(engine: engine, sender: "round \(round)")
                    try wormhole.passMessageObject(round, identifier: "status")
                    try wormhole.queue("jobs").enqueue(round)
                    // Idle longer than the engine keeps it: the connection goes back before the engine closes.
                    Thread.sleep(forTimeInterval: 3 * Connections.holdTime.secondsValue)
                }
                engine.close()
                // Every connection of the client at once (the listening one comes back once its thread is done).
                try await client.withConnection { first in
                    try await client.withConnection { second in
                        var total: Int64 = 0
                        for connection in [first, second] {
                            let rows = try await connection.query(
                                "SELECT count(*) FROM pg_catalog.pg_prepared_statements",
                                logger: Logger(label: "tests")
                            )
                            for try await count in rows.decode(Int64.self) { total += count }
                        }
                        counts.append(total)
                    }
                }
            }
            // The first engine prepared its statements; the next ones found them there, and prepared nothing more.
            #expect(counts.first ?? 0 > 0, "\(counts)")
            #expect(Set(counts).count == 1, "\(counts)")
        }
    }

    @Test("A connection kept idle after a call goes back to the client by itself, within moments")
    func keptConnectionGoesBack() async throws {
        try await withRunningClient(connections: 2) { client, _ in
            let engine = try await PostgresEngine(client: client, group: uniqueGroup("client"))
            defer { engine.close() }
            try await offThePool {
                // The listening connection and the one kept after this call: the client's whole pool.
                _ = try engine.core.hub.listeningBackend()
                try Wormhole(engine: engine, sender: "borrowing").passMessageObject("ready", identifier: "status")
            }
            // The client lends it again once the engine has kept it idle for its moment.
            let started = ContinuousClock.now
            try await client.withConnection { connection in
                _ = try await connection.query("SELECT 1", logger: Logger(label: "tests"))
            }
            #expect(ContinuousClock.now - started < .seconds(10))
        }
    }

    @Test("A client that is not running: opening fails within the time-out and says to run the client")
    func clientNotRunning() async throws {
        let client = try client()
        let started = ContinuousClock.now
        do {
            _ = try await PostgresEngine(client: client, group: uniqueGroup("client"), timeout: .milliseconds(300))
            Issue.record("An engine opened on a client that does not run.")
        } catch {
            #expect(error.code == .serverUnavailable)
            #expect(error.message.contains("run()"))
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        // The client can still run and shut down: the abandoned lease was given up.
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            try await client.withConnection { connection in
                _ = try await connection.query("SELECT 1", logger: Logger(label: "tests"))
            }
            tasks.cancelAll()
        }
    }
}
