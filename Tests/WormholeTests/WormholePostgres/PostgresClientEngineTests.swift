import Foundation
import Logging
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholePostgres

/// `PostgresEngine(client:group:)` borrows its connections from a `PostgresClient` the app runs: it must work as the
/// engine on its own connections does (the contract suites run it too, as `postgresClient`), give back connections
/// as it found them (no `LISTEN`, lock or session setting left behind), and say what is wrong when the client lends
/// nothing.
@Suite(
    "PostgreSQL engine on a PostgresClient",
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

    @Test("Made with the public initializer while the client runs, it passes queue messages to an engine of its own")
    func worksWithAnEngineOfItsOwn() async throws {
        let group = uniqueGroup("client")
        let client = try client()
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            let engine = try await PostgresEngine(client: client, group: group)
            defer {
                engine.close()
                tasks.cancelAll()
            }
            try await offThePool {
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

    @Test("Connections go back clean: the listening one closed, the store's out of its transaction, settings restored")
    func givesConnectionsBackClean() async throws {
        let group = uniqueGroup("client")
        // Two connections: one the engine listens on while it is open, one for every call.
        let client = try client(connections: 2)
        let schema = "s\(UInt32.random(in: 0...UInt32.max))"
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            defer { tasks.cancelAll() }
            // The app's own session settings, on both of the client's connections: the engine must leave them be.
            try await client.withConnection { first in
                try await client.withConnection { second in
                    for connection in [first, second] {
                        _ = try await connection.query(
                            "SELECT pg_catalog.set_config('wormhole.author', 'app-code', false)",
                            logger: Logger(label: "tests")
                        )
                    }
                }
            }
            let engine = try await PostgresEngine(client: client, group: group)
            let (listeningBackend, storeBackend) = try await offThePool {
                // Listening first, so that the engine's listening connection is not the one the store then uses.
                let wormhole = Wormhole(engine: engine, sender: "borrowing")
                let listener = try wormhole.listenForMessage(withIdentifier: "status", as: String.self) { _ in }
                try wormhole.passMessageObject("ready", identifier: "status")
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
                store.close()
                return (try engine.core.hub.listeningBackend(), storeBackend)
            }
            engine.close()
            // The listening connection (its LISTEN, its advisory lock) is closed, never lent again.
            var listeningGone = false
            let deadline = ContinuousClock.now + .seconds(10)
            while !listeningGone, ContinuousClock.now < deadline {
                listeningGone =
                    try await Self.count(
                        "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = \(listeningBackend)",
                        client
                    ) == 0
                if !listeningGone { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(listeningGone)
            // The connection the store used goes back (once the store is closed, or idle for a moment) as it was
            // lent: its session settings reset.
            var sawStoreConnection = false
            let storeDeadline = ContinuousClock.now + .seconds(10)
            while !sawStoreConnection, ContinuousClock.now < storeDeadline {
                try await client.withConnection { connection in
                    let rows = try await connection.query(
                        """
                        SELECT pg_catalog.pg_backend_pid(), pg_catalog.current_setting('search_path'),
                            coalesce(pg_catalog.current_setting('wormhole.author', true), ''),
                            pg_catalog.pg_current_xact_id()::text
                        """,
                        logger: Logger(label: "tests")
                    )
                    for try await (backend, searchPath, author, transaction) in rows.decode(
                        (Int32, String, String, String).self
                    ) {
                        #expect(!searchPath.contains(schema))
                        // The app set it on the connections the client had then; one opened since (in place of the
                        // listening one, closed) never had it.
                        if backend == storeBackend { #expect(author == "app-code") }
                        // Outside a transaction, each statement has one of its own.
                        let next = try await connection.query(
                            "SELECT pg_catalog.pg_current_xact_id()::text",
                            logger: Logger(label: "tests")
                        )
                        for try await nextTransaction in next.decode(String.self) {
                            #expect(nextTransaction != transaction)
                        }
                        sawStoreConnection = sawStoreConnection || backend == storeBackend
                    }
                }
                if !sawStoreConnection { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(sawStoreConnection)
        }
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
        let client = try client(connections: 2)
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            defer { tasks.cancelAll() }
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

    @Test("A connection kept idle after a call goes back to the client by itself, within moments")
    func keptConnectionGoesBack() async throws {
        let client = try client(connections: 2)
        try await withThrowingDiscardingTaskGroup { tasks in
            tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            defer { tasks.cancelAll() }
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
