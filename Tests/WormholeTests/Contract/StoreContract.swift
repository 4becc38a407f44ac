import Foundation
import GRDB
import PostgresNIO
import Testing
import WormholeKit
import WormholePostgres
import WormholeStore

/// The stores every store contract test runs against.
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    /// `SharedStore`: SQLite in a directory, for the processes of one host.
    case sqlite
    /// `PostgresStore`: PostgreSQL, for processes on several hosts.
    case postgres
    /// `PostgresStore` on an engine that borrows its connections from a `PostgresClient`: each call sets the
    /// store's session up on the borrowed connection and resets it.
    case postgresClient

    var testDescription: String {
        switch self {
        case .sqlite: "SQLite store"
        case .postgres: "PostgreSQL store"
        case .postgresClient: "PostgreSQL store on a PostgresClient"
        }
    }
}

/// The calls the contract makes, on either store: a table `item (id, value)` and a table `note (id, body)`.
protocol ContractStore: Sendable {
    func insert(_ table: String, id: Int64, value: Int64) throws
    func update(_ table: String, id: Int64, value: Int64) throws
    func delete(_ table: String, id: Int64) throws
    /// A write whose closure inserts a row, then throws.
    func failingWrite(id: Int64) throws
    func rows(_ table: String) throws -> Int
    func transactions(after token: Int64) throws -> [StoreTransaction]
    func currentToken() throws -> Int64
    func historyToken(forConsumer consumer: String) throws -> Int64?
    func acknowledge(_ transaction: StoreTransaction, consumer: String) throws
    func purgeHistory(maximumAge: Duration?) throws -> Int
    func remoteChanges(consumer: String?, tables: Set<String>?, includingOwnWrites: Bool) -> RemoteChangeSequence
    func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>?,
        errorHandler: (@Sendable (StoreError) -> Void)?,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws -> RemoteChangeObserver
}

extension SharedStore: ContractStore {
    func insert(_ table: String, id: Int64, value: Int64) throws {
        try write { db in try db.execute(sql: "INSERT INTO \(table) (id, value) VALUES (?, ?)", arguments: [id, value])
        }
    }
    func update(_ table: String, id: Int64, value: Int64) throws {
        try write { db in try db.execute(sql: "UPDATE \(table) SET value = ? WHERE id = ?", arguments: [value, id]) }
    }
    func delete(_ table: String, id: Int64) throws {
        try write { db in try db.execute(sql: "DELETE FROM \(table) WHERE id = ?", arguments: [id]) }
    }
    func failingWrite(id: Int64) throws {
        try write { db in
            try db.execute(sql: "INSERT INTO item (id, value) VALUES (?, 0)", arguments: [id])
            throw CancellationError()
        }
    }
    func rows(_ table: String) throws -> Int {
        try read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM \(table)") ?? 0 }
    }
    func transactions(after token: Int64) throws -> [StoreTransaction] { try transactions(after: token, limit: 1000) }
    func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>?,
        errorHandler: (@Sendable (StoreError) -> Void)?,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws -> RemoteChangeObserver {
        try observeRemoteChanges(
            consumer: consumer,
            tables: tables,
            includingOwnWrites: false,
            errorHandler: errorHandler,
            handler: handler
        )
    }
}

extension PostgresStore: ContractStore {
    // Table names are the contract's own constants, never input.
    func insert(_ table: String, id: Int64, value: Int64) throws {
        try write { db in try db.query("INSERT INTO \(unescaped: table) (id, value) VALUES (\(id), \(value))") }
    }
    func update(_ table: String, id: Int64, value: Int64) throws {
        try write { db in try db.query("UPDATE \(unescaped: table) SET value = \(value) WHERE id = \(id)") }
    }
    func delete(_ table: String, id: Int64) throws {
        try write { db in try db.query("DELETE FROM \(unescaped: table) WHERE id = \(id)") }
    }
    func failingWrite(id: Int64) throws {
        try write { db in
            try db.query("INSERT INTO item (id, value) VALUES (\(id), 0)")
            throw CancellationError()
        }
    }
    func rows(_ table: String) throws -> Int {
        try read { db in
            let rows = try db.query("SELECT count(*) FROM \(unescaped: table)")
            return Int(try rows[0].decode(Int64.self))
        }
    }
    func transactions(after token: Int64) throws -> [StoreTransaction] { try transactions(after: token, limit: 1000) }
    func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>?,
        errorHandler: (@Sendable (StoreError) -> Void)?,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws -> RemoteChangeObserver {
        try observeRemoteChanges(
            consumer: consumer,
            tables: tables,
            includingOwnWrites: false,
            errorHandler: errorHandler,
            handler: handler
        )
    }
}

/// One test's store: every ``open(author:)`` stands for a process of its own on the same store.
final class StoreFixture: Sendable {
    let kind: StoreKind
    let temporary = TemporaryDirectory()
    private let engines = Locked<[PostgresEngine]>([])
    private let clients = Locked<[RunningClient]>([])
    private let serverURL: String?
    let group = uniqueGroup("store")
    /// A schema of this test's own on the shared server.
    let schema = "s\(UInt32.random(in: 0...UInt32.max))"

    init(_ kind: StoreKind) throws {
        self.kind = kind
        serverURL = kind == .sqlite ? nil : try requireTestServerURL()
    }

    deinit {
        for engine in engines.withLock({ $0 }) { engine.close() }
        for client in clients.withLock({ $0 }) { client.stop() }
    }

    var serverURLForTools: String? { serverURL }

    /// A store as the process `author` opens it.
    func open(author: String, maximumAge: Duration = .seconds(3600)) throws -> any ContractStore {
        switch kind {
        case .sqlite:
            var migrator = DatabaseMigrator()
            migrator.registerMigration("v1") { db in
                try db.execute(sql: "CREATE TABLE item (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
                try db.execute(sql: "CREATE TABLE note (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
            }
            return try SharedStore(
                path: temporary("store.sqlite"),
                migrator: migrator,
                configuration: .init(author: author, historyMaximumAge: maximumAge)
            )
        case .postgres, .postgresClient:
            return try postgresStore(author: author, maximumAge: maximumAge)
        }
    }

    func postgresStore(author: String, maximumAge: Duration = .seconds(3600)) throws -> PostgresStore {
        let engine = try makeTestEngine(url: serverURL!, group: group, borrowing: kind == .postgresClient, clients)
        engines.withLock { $0.append(engine) }
        let schema = schema
        return try PostgresStore(
            engine: engine,
            name: "contract",
            schema: schema,
            migrations: [
                .init(
                    "v1",
                    sql: "CREATE SCHEMA \(schema)",
                    "CREATE TABLE item (id bigint PRIMARY KEY, value bigint NOT NULL)",
                    "CREATE TABLE note (id bigint PRIMARY KEY, value bigint NOT NULL)"
                )
            ],
            configuration: .init(author: author, historyMaximumAge: maximumAge)
        )
    }
}

/// The store contract: what `SharedStore` promises on one host, `PostgresStore` promises across hosts.
@Suite("Contract: stores", .limit(minutes: 3))
struct StoreContract {
    @Test(
        "Every committed write is recorded with its author and its rows' keys per table and operation",
        arguments: StoreKind.allCases
    )
    func historyRecordsKeys(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let store = try fixture.open(author: "app")
            let start = try store.currentToken()
            try store.insert("item", id: 1, value: 10)
            try store.update("item", id: 1, value: 11)
            try store.insert("note", id: 7, value: 1)
            try store.delete("item", id: 1)
            let history = try store.transactions(after: start)
            #expect(history.count == 4)
            #expect(history.allSatisfy { $0.author == "app" && abs($0.date.timeIntervalSinceNow) < 60 })
            #expect(history.map(\.tableNames) == [["item"], ["item"], ["note"], ["item"]])
            #expect(history[0].tables["item"]?.inserted.map(\.integerValue) == [1])
            #expect(history[1].tables["item"]?.updated.map(\.integerValue) == [1])
            #expect(history[2].tables["note"]?.inserted.map(\.integerValue) == [7])
            #expect(history[3].tables["item"]?.deleted.map(\.integerValue) == [1])
            #expect(zip(history, history.dropFirst()).allSatisfy { $0.id < $1.id }, "tokens grow")
            #expect(try store.currentToken() == history.last?.id)
        }
    }

    @Test("A closure that throws rolls its write back, records nothing, and says so", arguments: StoreKind.allCases)
    func failingWrite(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let store = try fixture.open(author: "app")
            let before = try store.currentToken()
            #expect {
                try store.failingWrite(id: 5)
            } throws: { error in
                (error as? StoreError)?.code == .handlerFailed
                    && (error as? StoreError)?.underlyingError is CancellationError
            }
            #expect(try store.rows("item") == 0)
            #expect(try store.currentToken() == before)
            #expect(try store.transactions(after: before).isEmpty)
        }
    }

    @Test(
        "Another process's commits arrive, filtered to the tables in scope, own writes left out",
        arguments: StoreKind.allCases
    )
    func remoteChanges(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let widget = try fixture.open(author: "widget")
            let app = try fixture.open(author: "app")
            let all = Collector<StoreTransaction>()
            let items = Collector<StoreTransaction>()
            let observer = try widget.observeRemoteChanges(consumer: "widget", tables: nil, errorHandler: nil) {
                all.append($0)
            }
            let itemsOnly = try widget.observeRemoteChanges(consumer: nil, tables: ["item"], errorHandler: nil) {
                items.append($0)
            }
            try widget.insert("item", id: 100, value: 0)  // its own: not delivered
            try app.insert("item", id: 1, value: 1)
            try app.insert("note", id: 1, value: 1)
            try app.update("item", id: 1, value: 2)
            #expect(eventually { all.count == 3 && items.count == 2 })
            #expect(all.values.map(\.author) == ["app", "app", "app"])
            #expect(all.values.map(\.tableNames) == [["item"], ["note"], ["item"]])
            #expect(items.values.map(\.id) == [all.values[0].id, all.values[2].id])
            observer.cancel()
            itemsOnly.cancel()
            #expect(try widget.historyToken(forConsumer: "widget") == all.values.last?.id)
        }
    }

    @Test(
        "A durable consumer that was away catches up from its token; breaking out leaves the last one to come again",
        arguments: StoreKind.allCases
    )
    func catchUp(kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind)
        let (widget, app) = try await offThePool {
            (try fixture.open(author: "widget"), try fixture.open(author: "app"))
        }
        // Register, then go away.
        try await offThePool {
            let observer = try widget.observeRemoteChanges(consumer: "widget", tables: nil, errorHandler: nil) { _ in }
            observer.cancel()
            for id in 1...20 { try app.insert("item", id: Int64(id), value: 0) }
        }
        let written = try await offThePool { try app.transactions(after: 0).map(\.id) }
        #expect(written.count == 20)
        var seen: [Int64] = []
        for try await transaction in widget.remoteChanges(consumer: "widget", tables: nil, includingOwnWrites: false) {
            seen.append(transaction.id)
            if seen.count == 20 { break }
        }
        #expect(seen == written)
        var again = widget.remoteChanges(consumer: "widget", tables: nil, includingOwnWrites: false)
            .makeAsyncIterator()
        #expect(try await again.next()?.id == written[19], "the one not acknowledged comes again")
        #expect(try await offThePool { try widget.historyToken(forConsumer: "widget") } == written[18])
    }

    @Test(
        "More than a batch of skipped transactions (own writes) does not hold back the next remote one",
        arguments: StoreKind.allCases
    )
    func manySkipped(kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind)
        let (widget, app) = try await offThePool {
            (try fixture.open(author: "widget"), try fixture.open(author: "app"))
        }
        try await offThePool {
            // Both consumers register, then are away while 150 of their own writes and one remote commit.
            for name in ["observer", "iterator"] {
                try widget.observeRemoteChanges(consumer: name, tables: nil, errorHandler: nil) { _ in }.cancel()
            }
            for id in 1...150 { try widget.insert("item", id: Int64(id), value: 0) }
            try app.insert("item", id: 1000, value: 0)
        }
        // Catching up, each reads past the first batch, all skipped, at once: no commit comes to wake them again, and
        // the waits stay under the PostgreSQL engine's 10 s safety wake-up.
        let received = Collector<StoreTransaction>()
        let observer = try await offThePool {
            try widget.observeRemoteChanges(consumer: "observer", tables: nil, errorHandler: nil) {
                received.append($0)
            }
        }
        #expect(await eventuallyAwaiting(timeout: 8) { received.count == 1 })
        #expect(received.values.first?.author == "app")
        observer.cancel()
        let first = try await withThrowingTaskGroup(of: StoreTransaction?.self) { group in
            group.addTask {
                var iterator = widget.remoteChanges(consumer: "iterator", tables: nil, includingOwnWrites: false)
                    .makeAsyncIterator()
                return try await iterator.next()
            }
            group.addTask {
                try await Task.sleep(for: .seconds(8))
                return nil
            }
            defer { group.cancelAll() }
            return try await group.next() ?? nil
        }
        #expect(first?.author == "app", "the sequence read on too")
    }

    @Test(
        "A handler that throws leaves its transaction unacknowledged: it comes again, reported as handlerFailed",
        arguments: StoreKind.allCases
    )
    func handlerFails(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let widget = try fixture.open(author: "widget")
            let app = try fixture.open(author: "app")
            let attempts = Collector<Int64>()
            let errors = Collector<StoreError.Code>()
            let observer = try widget.observeRemoteChanges(
                consumer: "widget",
                tables: nil,
                errorHandler: { errors.append($0.code) }
            ) { transaction in
                attempts.append(transaction.id)
                if attempts.count == 1 { throw CancellationError() }
            }
            try app.insert("item", id: 1, value: 1)
            #expect(eventually { errors.count == 1 })
            #expect(errors.values == [.handlerFailed])
            try app.insert("item", id: 2, value: 1)  // the next commit offers the first again
            #expect(eventually { attempts.count == 3 })
            let ids = attempts.values
            #expect(ids[0] == ids[1] && ids[2] > ids[1])
            observer.cancel()
            #expect(try widget.historyToken(forConsumer: "widget") == ids[2])
        }
    }

    @Test(
        "Acknowledging by hand moves a consumer's token; a consumer stopped mid-merge gets only the unmerged one",
        arguments: StoreKind.allCases
    )
    func acknowledgeByHand(kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind)
        let (widget, app) = try await offThePool {
            (try fixture.open(author: "widget"), try fixture.open(author: "app"))
        }
        var first = widget.remoteChanges(consumer: "merger", tables: nil, includingOwnWrites: false).makeAsyncIterator()
        try await offThePool {
            try app.insert("item", id: 1, value: 1)
            try app.insert("item", id: 2, value: 1)
        }
        let merged = try #require(try await first.next())
        try await offThePool { try widget.acknowledge(merged, consumer: "merger") }
        let unmerged = try #require(try await first.next())
        // Stopped here, while merging `unmerged`: a new iteration starts with it.
        var second = widget.remoteChanges(consumer: "merger", tables: nil, includingOwnWrites: false)
            .makeAsyncIterator()
        #expect(try await second.next()?.id == unmerged.id)
        #expect(merged.id < unmerged.id)
    }

    @Test(
        "Merged history is purged; a consumer gone longer than the maximum age no longer holds it",
        arguments: StoreKind.allCases
    )
    func purge(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let app = try fixture.open(author: "app")
            let observer = try app.observeRemoteChanges(consumer: "slow", tables: nil, errorHandler: nil) { _ in }
            observer.cancel()
            for id in 1...5 { try app.insert("item", id: Int64(id), value: 0) }
            #expect(try app.purgeHistory(maximumAge: .seconds(3600)) == 0, "the consumer has merged nothing")
            #expect(try app.transactions(after: 0).count == 5)
            Thread.sleep(forTimeInterval: 1.2)
            // Gone longer than a second: the consumer goes, and the history older than a second with it (SQLite keeps
            // the newest row, whose id keeps tokens from being reused).
            let purged = try app.purgeHistory(maximumAge: .seconds(1))
            #expect(purged == 5 || purged == 4)
            #expect(try app.historyToken(forConsumer: "slow") == nil)
            #expect(try app.transactions(after: 0).count <= 5 - purged)
            let last = try app.currentToken()
            try app.insert("item", id: 6, value: 0)
            #expect(try app.transactions(after: 0).map(\.id).allSatisfy { $0 > last }, "tokens are never reused")
        }
    }

    @Test(
        "History every registered consumer has merged stays for a grace period, for passing consumers",
        arguments: StoreKind.allCases
    )
    func mergedHistoryGrace(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let app = try fixture.open(author: "app")
            let widget = try fixture.open(author: "widget")
            let passing = Collector<Int64>()
            let durable = try widget.observeRemoteChanges(consumer: "durable", tables: nil, errorHandler: nil) { _ in }
            // Registered nowhere: only the grace keeps what the durable consumer merged for it.
            let observer = try widget.observeRemoteChanges(consumer: nil, tables: nil, errorHandler: nil) {
                passing.append($0.id)
            }
            for id in 1...3 { try app.insert("item", id: Int64(id), value: 0) }
            let newest = try app.currentToken()
            // (Well within the 30 s grace.)
            #expect(eventually(timeout: 10) { (try? app.historyToken(forConsumer: "durable")) == newest })
            // What the durable consumer merged is younger than the grace: a purge from any process keeps it.
            #expect(try app.purgeHistory(maximumAge: nil) == 0, "merged, but younger than the grace")
            #expect(try app.transactions(after: 0).count == 3)
            #expect(eventually(timeout: 30) { passing.count == 3 })
            #expect(passing.values == passing.values.sorted())
            durable.cancel()
            observer.cancel()
        }
    }

    @Test(
        "Four writers at once: every consumer gets every transaction once, in token order",
        arguments: StoreKind.allCases
    )
    func concurrentWriters(kind: StoreKind) async throws {
        try await offThePool {
            let fixture = try StoreFixture(kind)
            let reader = try fixture.open(author: "reader")
            let received = Collector<StoreTransaction>()
            let observer = try reader.observeRemoteChanges(consumer: "reader", tables: nil, errorHandler: nil) {
                received.append($0)
            }
            let writers = try (0..<4).map { try fixture.open(author: "writer-\($0)") }
            DispatchQueue.concurrentPerform(iterations: 4) { index in
                for n in 0..<25 { try? writers[index].insert("item", id: Int64(index * 1000 + n), value: 0) }
            }
            #expect(eventually(timeout: 30) { received.count == 100 })
            let ids = received.values.map(\.id)
            #expect(ids == ids.sorted() && Set(ids).count == 100)
            for writer in 0..<4 {
                let keys = received.values.filter { $0.author == "writer-\(writer)" }
                    .compactMap { $0.tables["item"]?.inserted.first?.integerValue }
                #expect(keys == (0..<25).map { Int64(writer * 1000 + $0) }, "each writer's in its order")
            }
            observer.cancel()
        }
    }
}
