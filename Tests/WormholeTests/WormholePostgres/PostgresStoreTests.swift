import Foundation
import PostgresNIO
import Testing
import WormholeCLI
import WormholeKit
import WormholePostgres

/// The PostgreSQL store's own promises, beyond the store contract: external writers, ordering against a transaction
/// that stays open, migrations run once, a server restart. A real server each (the test run's, or one of the test's
/// own when it restarts it).
@Suite("PostgreSQL store", .slow("needs a PostgreSQL server (and some, network namespaces)"), .limit(minutes: 3))
struct PostgresStoreTests {
    static func open(
        url: String,
        group: String,
        author: String,
        migrations: [PostgresStore.Migration] = [itemTable]
    ) throws -> PostgresStore {
        let engine = try PostgresEngine(url: url, group: group)
        return try PostgresStore(
            engine: engine,
            name: "tests",
            schema: schema(group),
            migrations: migrations,
            configuration: .init(author: author)
        )
    }

    /// The schema of a test's group: one a test, on a shared server.
    static func schema(_ group: String) -> String { "s_" + group.replacingOccurrences(of: ".", with: "_") }

    static let itemTable = PostgresStore.Migration("items") { db in
        // The store's schema is its connections' search path (quoted by the store).
        let schema = try db.query("SELECT current_setting('search_path')")[0].decode(String.self)
        try db.query(PostgresQuery(unsafeSQL: "CREATE SCHEMA IF NOT EXISTS \(schema)"))
        try db.query("CREATE TABLE item (id bigserial PRIMARY KEY, writer text NOT NULL, value bigint NOT NULL)")
        try db.query("CREATE TABLE migration_run (id bigserial PRIMARY KEY)")
        try db.query("INSERT INTO migration_run DEFAULT VALUES")
    }

    static func insert(_ store: PostgresStore, _ value: Int64) throws {
        try store.write { db in try db.query("INSERT INTO item (writer, value) VALUES (\(store.author), \(value))") }
    }

    @Test("The purge finds the last transaction committed before a time by bisecting ids, as a scan would")
    func purgeBisects() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("bisect")
            _ = try Self.open(url: server.url, group: group, author: "app")  // the schema at its newest version
            // 3,000 transactions from id 101 (as after an earlier purge): the first 1,234 committed two hours ago, the
            // next 766 a minute ago (older than the grace, younger than an hour), the rest now.
            try server.psql(
                """
                INSERT INTO wormhole.store_transactions (grp, store, id, xid, author, committed)
                SELECT '\(group)', 'bisect', 100 + n, '1'::xid8, 'tests', now() - CASE
                    WHEN n <= 1234 THEN interval '2 hours' WHEN n <= 2000 THEN interval '1 minute' ELSE interval '0' END
                FROM generate_series(1, 3000) AS n
                """
            )
            let ages = [
                "3 hours", "2 hours", "119 minutes", "1 hour", "1 minute", "59 seconds", "0 seconds", "-1 hour",
            ]
            for age in ages {
                // Both answers for one time, in one statement.
                let answers = try server.psql(
                    """
                    SELECT wormhole.store_last_before('\(group)', 'bisect', q.t) || ' ' || (
                        SELECT coalesce(max(id), 0) FROM wormhole.store_transactions
                        WHERE grp = '\(group)' AND store = 'bisect' AND committed < q.t)
                    FROM (SELECT now() - interval '\(age)' AS t) q
                    """
                ).split(separator: " ")
                #expect(answers.count == 2 && answers[0] == answers[1], "committed more than \(age) ago: \(answers)")
            }
            let purge = "SELECT wormhole.store_purge('\(group)', 'bisect', 3600)"
            #expect(try server.psql(purge) == "1234", "no consumer: what is older than an hour goes")
            try server.psql(
                """
                INSERT INTO wormhole.store_consumers (grp, store, consumer, token)
                VALUES ('\(group)', 'bisect', 'merged', 3100)
                """
            )
            #expect(try server.psql(purge) == "766", "a consumer merged everything: what is older than the grace goes")
            let left = try server.psql(
                "SELECT count(*) || ' ' || min(id) FROM wormhole.store_transactions WHERE grp = '\(group)'"
            )
            #expect(left == "1000 2101")
        }
    }

    @Test(
        "A read whose closure leaves a transaction open has it rolled back when the closure returns",
        arguments: [
            ["BEGIN ISOLATION LEVEL REPEATABLE READ"],
            ["START TRANSACTION"],
            // A rollback to a savepoint answers `ROLLBACK` too, and leaves the transaction open.
            ["BEGIN", "SAVEPOINT partial", "ROLLBACK TO SAVEPOINT partial"],
        ]
    )
    func readRollsBackAnOpenTransaction(statements: [String]) async throws {
        try await offThePool {
            let store = try Self.open(url: try requireTestServerURL(), group: uniqueGroup("store"), author: "app")
            defer { store.close() }
            func transaction(_ db: PostgresStore.StoreConnection) throws -> String {
                try db.query("SELECT pg_catalog.pg_current_xact_id()::text")[0].decode(String.self)
            }
            let (opened, backend) = try store.read { db in
                for statement in statements { try db.query(PostgresQuery(unsafeSQL: statement)) }
                return (try transaction(db), try db.query("SELECT pg_catalog.pg_backend_pid()")[0].decode(Int32.self))
            }
            // The next read, on the same connection (the only one idle): each statement in a transaction of its own.
            let (first, second, sameBackend) = try store.read { db in
                (
                    try transaction(db), try transaction(db),
                    try db.query("SELECT pg_catalog.pg_backend_pid()")[0].decode(Int32.self) == backend
                )
            }
            #expect(sameBackend)
            #expect(first != second)
            #expect(first != opened)
        }
    }

    @Test(
        "A transaction of 25,000 changes is read whole, in pages; a read stops after 10,000 changes, within 100 transactions"
    )
    func boundedReads() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("bounded")
            let store = try Self.open(url: server.url, group: group, author: "app")
            let start = try store.currentToken()
            // Three transactions of 4,000 rows, then 1,000, one of 12,000, and one that changes only a table nobody
            // follows.
            for count in [4000, 4000, 4000, 1000] {
                try store.write { db in
                    try db.query(
                        "INSERT INTO item (writer, value) SELECT 'app', n FROM generate_series(1, \(count)) AS n"
                    )
                }
            }
            try store.write { db in
                try db.query("INSERT INTO item (writer, value) SELECT 'app', n FROM generate_series(1, 12000) AS n")
            }
            try store.write { db in try db.query("INSERT INTO migration_run DEFAULT VALUES") }

            // The first read stops within the third transaction's page (12,000 rows past 10,000) and reads that
            // transaction whole; the next read goes on from there.
            let first = try store.transactions(after: start)
            #expect(first.map { $0.tables["item"]?.inserted.count ?? 0 } == [4000, 4000, 4000])
            let second = try store.transactions(after: try #require(first.last).id)
            // 1,000 rows, then the big transaction's first 9,000 fill the page: the rest of it is read in a page of
            // its own, and the read ends with it.
            #expect(second.map { $0.tables["item"]?.inserted.count ?? 0 } == [1000, 12000])
            let big = try #require(second.last)
            #expect(Set(big.tables["item"]?.inserted ?? []).count == 12000, "a change read twice or lost")
            let third = try store.transactions(after: big.id)
            #expect(third.map { $0.tables.keys.sorted() } == [["migration_run"]])
            // Following one table: the other's transaction is left out, and a whole read is the same.
            let followed = try store.transactions(after: try #require(first.last).id, tables: ["item"])
            #expect(followed.map { $0.tables["item"]?.inserted.count ?? 0 } == [1000, 12000])
            var all: [StoreTransaction] = []
            var token = start
            while case let batch = try store.transactions(after: token, tables: ["item"]), let last = batch.last {
                all += batch
                token = last.id
            }
            #expect(all.count == 5)
            #expect(all.reduce(0) { $0 + ($1.tables["item"]?.inserted.count ?? 0) } == 25000)
        }
    }

    @Test("A write from psql, outside any store, is recorded as external and reaches consumers")
    func externalWrite() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            let store = try Self.open(url: server.url, group: group, author: "app")
            let received = Collector<StoreTransaction>()
            let observer = try store.observeRemoteChanges(consumer: "app") { received.append($0) }
            try server.psql("INSERT INTO \(Self.schema(group)).item (writer, value) VALUES ('psql', 1)")
            #expect(eventually { received.count == 1 })
            #expect(received.values.first?.author == "external")
            #expect(received.values.first?.tables["item"]?.inserted.count == 1)
            observer.cancel()
        }
    }

    @Test(
        "A transaction that stays open while later ones commit is delivered when it commits, after them: none skipped"
    )
    func longOpenTransaction() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            let store = try Self.open(url: server.url, group: group, author: "app")
            let slow = try Self.open(url: server.url, group: group, author: "slow")
            let received = Collector<StoreTransaction>()
            let observer = try store.observeRemoteChanges(consumer: "app", includingOwnWrites: true) {
                received.append($0)
            }
            let release = DispatchSemaphore(value: 0)
            let inserted = DispatchSemaphore(value: 0)
            let finished = DispatchSemaphore(value: 0)
            Thread {
                // Its first write takes its xid before the others begin; it commits last, and gets its history id then.
                try? slow.write { db in
                    try db.query("INSERT INTO item (writer, value) VALUES ('slow', 0)")
                    inserted.signal()
                    _ = release.wait(timeout: .now() + 30)
                }
                finished.signal()
            }.start()
            #expect(inserted.wait(timeout: .now() + 10) == .success)
            for value in 1...10 { try Self.insert(store, Int64(value)) }
            #expect(eventually { received.count == 10 })
            Thread.sleep(forTimeInterval: 2)  // it stays open for seconds; the others are delivered meanwhile
            #expect(received.count == 10)
            release.signal()
            #expect(finished.wait(timeout: .now() + 10) == .success)
            #expect(eventually { received.count == 11 })
            let values = received.values
            #expect(values.map(\.id) == values.map(\.id).sorted() && Set(values.map(\.id)).count == 11)
            #expect(values.last?.author == "slow", "delivered in commit order: last")
            observer.cancel()
        }
    }

    @Test("Processes opening a new store at once: all succeed, the migration runs once")
    func concurrentFirstOpen() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            let opened = Collector<Bool>()
            DispatchQueue.concurrentPerform(iterations: 4) { index in
                do {
                    _ = try Self.open(url: server.url, group: group, author: "opener-\(index)")
                    opened.append(true)
                } catch {
                    Issue.record("opener \(index): \(error)")
                }
            }
            #expect(opened.count == 4)
            let runs = try server.psql("SELECT count(*) FROM \(Self.schema(group)).migration_run")
            #expect(runs == "1")
        }
    }

    @Test("A failing migration keeps nothing of the opening and says which one failed")
    func failingMigration() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            #expect {
                _ = try Self.open(
                    url: server.url,
                    group: group,
                    author: "app",
                    migrations: [Self.itemTable, .init("broken", sql: "CREATE TABLE item (id int)")]
                )
            } throws: { error in
                (error as? StoreError)?.code == .migrationFailed && "\(error)".contains("broken")
            }
            let schemaExists = try server.psql(
                "SELECT count(*) FROM pg_namespace WHERE nspname = '\(Self.schema(group))'"
            )
            #expect(schemaExists == "0", "the first migration was rolled back with the second")
        }
    }

    @Test("The server restarted mid-stream: a consumer misses nothing and gets nothing twice", .timeLimit(.minutes(3)))
    func serverRestart() async throws {
        if let reason = LocalPostgresServer.unavailableReason() { try Test.cancel("No PostgreSQL here: \(reason)") }
        try await offThePool {
            let server = try LocalPostgresServer(durable: true)
            defer { server.close() }
            let group = uniqueGroup("store")
            let store = try Self.open(url: server.url, group: group, author: "app")
            let writer = try Self.open(url: server.url, group: group, author: "writer")
            let received = Collector<StoreTransaction>()
            let observer = try store.observeRemoteChanges(consumer: "app", errorHandler: { _ in }) {
                received.append($0)
            }
            for value in 0..<50 { try Self.insert(writer, Int64(value)) }
            try server.restart()
            var written = 50
            let deadline = Date() + 60
            while written < 100, Date() < deadline {
                do {
                    try Self.insert(writer, Int64(written))
                    written += 1
                } catch StoreError.Code.unavailable {
                    Thread.sleep(forTimeInterval: 0.1)  // the pool's old connections fail once each
                }
            }
            #expect(written == 100)
            #expect(eventually(timeout: 30) { received.count >= 100 })
            let ids = received.values.map(\.id)
            // A write cut off by the restart may have committed before it failed, and was written again.
            #expect(ids == Array(1...Int64(ids.count)), "in order, none twice, none missing")
            #expect(ids.count >= 100)
            observer.cancel()
        }
    }

    @Test("A statement that failed inside a write, its error swallowed, fails the write: nothing written, none hidden")
    func swallowedFailure() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            let store = try Self.open(url: server.url, group: group, author: "app")
            let before = try store.currentToken()
            #expect {
                try store.write { db in
                    try db.query("INSERT INTO item (writer, value) VALUES ('app', 1)")
                    _ = try? db.query("INSERT INTO no_such_table VALUES (1)")
                }
            } throws: { error in
                (error as? StoreError)?.code == .database && "\(error)".contains("rolled back")
            }
            #expect(try store.currentToken() == before)
            // The connection went back clean: the next write works.
            try Self.insert(store, 2)
            #expect(try store.transactions(after: before).count == 1)
        }
    }

    @Test("Two stores on one schema are refused, and a partition's rows are recorded under their table")
    func schemaOwnershipAndPartitions() async throws {
        try await offThePool {
            let server = try requireTestServer()
            let group = uniqueGroup("store")
            let partitioned = PostgresStore.Migration("partitioned") { db in
                try db.query(
                    "CREATE TABLE reading (id bigint NOT NULL, at date NOT NULL, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)"
                )
                try db.query(
                    "CREATE TABLE reading_2026 PARTITION OF reading FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"
                )
            }
            let store = try Self.open(
                url: server.url,
                group: group,
                author: "app",
                migrations: [Self.itemTable, partitioned]
            )
            let start = try store.currentToken()
            try store.write { db in try db.query("INSERT INTO reading (id, at) VALUES (1, '2026-11-24')") }
            #expect(try store.transactions(after: start).first?.tableNames == ["reading"])
            #expect {
                _ = try PostgresStore(
                    engine: try PostgresEngine(url: server.url, group: group),
                    name: "another",
                    schema: Self.schema(group)
                )
            } throws: { error in
                "\(error)".contains("is tracked by the store tests")
            }
        }
    }
}
