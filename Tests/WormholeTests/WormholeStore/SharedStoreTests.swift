import Foundation
import GRDB
import Synchronization
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholeStore

/// The store's tests: a real SQLite database in a temporary directory, real child processes (the `wormhole` tool)
/// writing and watching it, real inotify between them.
@Suite("Shared store", .limit(minutes: 2))
struct SharedStoreTests {
    let directory = TemporaryDirectory()
    var path: String { directory("store.sqlite") }

    static var migrator: DatabaseMigrator {
        // The harness's schema (`exercise-store`), so that its processes and these tests agree.
        var migrator = StoreFixtures.itemsMigrator
        migrator.registerMigration("more") { db in
            try db.execute(sql: "CREATE TABLE tag (name TEXT PRIMARY KEY, color TEXT)")
            try db.execute(sql: "CREATE TABLE pair (a INTEGER, b TEXT, note TEXT, PRIMARY KEY (a, b)) WITHOUT ROWID")
            try db.execute(sql: "CREATE TABLE cache (id INTEGER PRIMARY KEY, value TEXT)")
            try db.execute(sql: "CREATE TABLE blobby (key BLOB PRIMARY KEY, value TEXT)")
        }
        return migrator
    }

    func open(author: String = "tests", untracked: Set<String> = [], bridge: Bool = true) throws -> SharedStore {
        try SharedStore(
            path: path,
            migrator: Self.migrator,
            configuration: .init(author: author, untrackedTables: untracked, observesRemoteChanges: bridge)
        )
    }

    @Test("Every committed write is recorded with its author, time and primary keys per table and operation")
    func historyRecordsPrimaryKeys() async throws {
        try await offThePool {
            let store = try open(untracked: ["cache"])
            try store.write { db in
                try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('a', 1), ('b', 2)")
                try db.execute(sql: "INSERT INTO tag(name, color) VALUES ('red', '#f00')")
                try db.execute(sql: "INSERT INTO pair(a, b, note) VALUES (1, 'x', 'n')")
                try db.execute(sql: "INSERT INTO cache(id, value) VALUES (1, 'not recorded')")
                try db.execute(sql: "INSERT INTO blobby(key, value) VALUES (x'CAFE', 'blob key')")
            }
            try store.write { db in
                try db.execute(sql: "UPDATE item SET value = 10 WHERE id = 1")
                try db.execute(sql: "DELETE FROM tag WHERE name = 'red'")
            }
            try store.write { _ in }  // a write that changes nothing records nothing
            let history = try store.transactions()
            #expect(history.count == 2)
            let first = try #require(history.first)
            #expect(first.author == "tests")
            #expect(abs(first.date.timeIntervalSinceNow) < 60)
            #expect(first.tables["item"]?.inserted.map(\.integerValue) == [1, 2])
            #expect(first.tables["tag"]?.inserted == [PrimaryKey(["name": .text("red")])])
            #expect(first.tables["pair"]?.inserted == [PrimaryKey(["a": .integer(1), "b": .text("x")])])
            #expect(first.tables["blobby"]?.inserted == [PrimaryKey(["key": .text("CAFE")])])
            #expect(first.tables["cache"] == nil, "untracked tables are not recorded")
            let second = history[1]
            #expect(second.id > first.id)
            #expect(second.tables["item"]?.updated.map(\.integerValue) == [1])
            #expect(second.tables["tag"]?.deleted == [PrimaryKey(["name": .text("red")])])
            #expect(try store.currentToken() == second.id)
            #expect(permissions(path) == 0o600)
        }
    }

    @Test("Writes by another tool are recorded as author 'external' at the next write through a store")
    func externalWrites() async throws {
        try await offThePool {
            let sqlite = "/usr/bin/sqlite3"
            guard FileManager.default.isExecutableFile(atPath: sqlite) else { return }
            let store = try open()
            let shell = Process()
            shell.executableURL = URL(fileURLWithPath: sqlite)
            shell.arguments = [path, "INSERT INTO item(writer, value) VALUES ('shell', 1);"]
            try shell.run()
            shell.waitUntilExit()
            #expect(shell.terminationStatus == 0)
            try store.write { db in try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('store', 2)") }
            let history = try store.transactions()
            #expect(history.map(\.author) == ["external", "tests"])
            #expect(history.map { $0.tables["item"]?.inserted.first?.integerValue } == [1, 2])
        }
    }

    @Test("Another process's commits arrive here at once, filtered to the tables in scope, own writes excluded")
    func remoteChangesFromAnotherProcess() async throws {
        try await offThePool {
            let store = try open()
            let received = Collector<StoreTransaction>()
            let observer = try store.observeRemoteChanges(consumer: "here", tables: ["item"]) { received.append($0) }
            try store.write { db in try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('own', 0)") }
            let child = try WormholeTool.run([
                "exercise-store", "write", "--path", path, "--count", "3", "--tag", "child",
            ])
            #expect(child.status == 0, "\(child.error)")
            let tagged = try WormholeTool.run([
                "store", "sql", path, "INSERT INTO tag(name) VALUES ('t')", "--author", "child",
            ])
            #expect(tagged.status == 0)
            #expect(eventually { received.count == 3 })
            usleep(200_000)
            #expect(
                received.values.map(\.author) == ["child", "child", "child"],
                "own writes and out-of-scope tables skipped"
            )
            #expect(received.values.allSatisfy { $0.tableNames == ["item"] })
            #expect(eventually { observer.historyToken == (try? store.currentToken()) })
        }
    }

    @Test("A GRDB ValueObservation here fires after another process commits to its region")
    func valueObservationAcrossProcesses() async throws {
        try await offThePool {
            let store = try open()
            let values = Collector<Int>()
            let observation = ValueObservation.tracking { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? 0
            }
            .removeDuplicates()
            let cancellable = observation.start(
                in: store.databasePool,
                scheduling: .async(onQueue: DispatchQueue(label: "test.observation")),
                onError: { Issue.record($0) },
                onChange: { values.append($0) }
            )
            #expect(eventually { values.values == [0] }, "observed \(values.values)")
            let child = try WormholeTool.run([
                "exercise-store", "write", "--path", path, "--count", "1", "--tag", "child",
            ])
            #expect(child.status == 0)
            #expect(eventually { values.values.last == 1 }, "observed \(values.values)")
            cancellable.cancel()
        }
    }

    @Test("A durable consumer that was away catches up on start, from its stored token")
    func durableConsumerCatchesUp() async throws {
        let store = try open()
        // Register, then go away.
        do {
            let observer = try store.observeRemoteChanges(consumer: "widget") { _ in }
            observer.cancel()
        }
        let path = path
        let status = try await offThePool {
            try WormholeTool.run(["exercise-store", "write", "--path", path, "--count", "4", "--tag", "app"]).status
        }
        #expect(status == 0)
        let written = try store.transactions().map(\.id)
        #expect(written.count == 4)
        var seen: [Int64] = []
        for try await transaction in store.remoteChanges(consumer: "widget") {
            seen.append(transaction.id)
            if seen.count == 4 { break }
        }
        #expect(seen == written)
        // Breaking out left the last one unacknowledged: it comes again, and nothing before it.
        let again = store.remoteChanges(consumer: "widget")
        var iterator = again.makeAsyncIterator()
        #expect(try await iterator.next()?.id == written[3])
        #expect(try store.historyToken(forConsumer: "widget") == written[2])
    }

    @Test("A consumer killed while merging gets the unacknowledged transaction again, and never the merged one")
    func consumerKilledMidMerge() async throws {
        try await offThePool {
            _ = try open()
            let consumer = try RunningTool(["exercise-store", "consume-then-crash", "--path", path, "--tag", "killed"])
            #expect(consumer.waitForError(containing: "watching"))
            #expect(
                try WormholeTool.run(["exercise-store", "write", "--path", path, "--count", "2", "--tag", "app"]).status
                    == 0
            )
            let result = consumer.finish(timeout: 20)
            #expect(result.status != 0, "it killed itself")
            let store = try open(author: "checker")
            let written = try store.transactions().map(\.id)
            #expect(written.count == 2)
            #expect(result.lines == written.map { "merging \($0)" })
            #expect(try store.historyToken(forConsumer: "killed") == written[0])
            let received = Collector<Int64>()
            let observer = try store.observeRemoteChanges(consumer: "killed") { received.append($0.id) }
            #expect(eventually { received.values == [written[1]] })
            observer.cancel()
        }
    }

    @Test("Two processes opening a new store at once: both succeed, the migration runs once")
    func concurrentFirstOpen() async throws {
        try await offThePool {
            for round in 0..<3 {
                let file = directory("race-\(round).sqlite")
                let openers = try (0..<2).map { _ in try RunningTool(["exercise-store", "open", "--path", file]) }
                for opener in openers {
                    let result = opener.finish()
                    #expect(result.status == 0, "\(result.error)")
                }
                let runs = try WormholeTool.run([
                    "store", "sql", file, "SELECT COUNT(*) AS runs FROM migration_run", "--query",
                ])
                #expect(runs.lines == [#"{"runs":1}"#])
            }
        }
    }

    @Test("A corrupted history row gives a clear error; the rest is still delivered")
    func corruptHistoryRow() async throws {
        try await offThePool {
            let store = try open()
            let received = Collector<StoreTransaction>()
            let errors = Collector<StoreError>()
            let observer = try store.observeRemoteChanges(
                consumer: "c",
                includingOwnWrites: true,
                errorHandler: { errors.append($0) }
            ) {
                received.append($0)
            }
            // Pause delivery by writing through the raw pool (no notification), damage one row, then notify.
            try store.databasePool.write { db in
                try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('a', 1), ('b', 2)")
            }
            try store.write { db in try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('c', 3)") }
            #expect(eventually { received.count == 2 })
            try store.databasePool.write { db in
                try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('d', 4), ('e', 5)")
                try db.execute(
                    sql:
                        "UPDATE wormhole_history SET primary_key = '{not json' WHERE id = (SELECT MAX(id) FROM wormhole_history)"
                )
            }
            try store.write { db in try db.execute(sql: "INSERT INTO item(writer, value) VALUES ('f', 6)") }
            #expect(eventually { received.count == 4 })
            let damaged = try #require(received.values.first { !$0.damagedChanges.isEmpty })
            #expect(damaged.tables["item"]?.inserted.map(\.integerValue) == [4])
            #expect(damaged.damagedChanges.first?.reason.contains("not a JSON object") == true)
            #expect(errors.values.map(\.code) == [.corruptHistory])
            #expect(errors.values.first?.message.contains("cannot be read") == true)
            observer.cancel()
        }
    }

    @Test("History every consumer has merged is purged; a consumer gone too long no longer holds it")
    func purge() async throws {
        try await offThePool {
            let store = try open()
            let fast = try store.observeRemoteChanges(consumer: "fast", includingOwnWrites: true) { _ in }
            let slow = try store.observeRemoteChanges(consumer: "slow", includingOwnWrites: true) { _ in
                throw CancellationError()
            }
            for value in 0..<5 {
                try store.write { db in try db.execute(sql: "INSERT INTO item(value) VALUES (?)", arguments: [value]) }
            }
            let newest = try store.currentToken()
            #expect(eventually { (try? store.historyToken(forConsumer: "fast")) == newest })
            #expect(try store.purgeHistory() == 0, "the slow consumer has merged nothing")
            #expect(try store.transactions().count == 5)
            slow.cancel()
            // The slow consumer is not seen again: with a maximum age of zero it is dropped, and what only it needed goes.
            usleep(20_000)
            try store.purgeHistory(maximumAge: .milliseconds(10))
            #expect(try store.historyToken(forConsumer: "slow") == nil)
            #expect(try store.transactions().isEmpty)
            fast.cancel()
        }
    }

    @Test("A store whose consumers read the history closes its read-only connection first: its WAL is checkpointed")
    func closesTheHistoryConnectionFirst() async throws {
        try await offThePool {
            do {
                let store = try open(bridge: false)
                let received = Collector<Int64>()
                let observer = try store.observeRemoteChanges(consumer: nil, includingOwnWrites: true) {
                    received.append($0.id)
                }
                try store.write { db in try db.execute(sql: "INSERT INTO item(value) VALUES (1)") }
                #expect(eventually { received.count == 1 }, "the consumer read the history")
                observer.cancel()
            }
            // The last connection to close checkpoints the WAL and removes it: the writer, not the read-only one.
            #expect(
                eventually { !FileManager.default.fileExists(atPath: path + "-wal") },
                "the WAL is left behind: a read-only connection closed last"
            )
        }
    }

    @Test("Purging by age finds the last commit before the cutoff by bisecting ids, as a scan of the times would")
    func purgeByAgeAmongMany() async throws {
        try await offThePool {
            let store = try open()
            let now = Date().timeIntervalSince1970
            // 3,000 transactions of one to three changes: the first 1,234 committed two hours ago, the next 766 a
            // minute ago (older than the grace, younger than the hour), the rest now.
            let commits = try store.databasePool.write { db -> [Int64] in
                try (0..<3000).map { index in
                    for _ in 0...(index % 3) {
                        try db.execute(
                            sql: """
                                INSERT INTO wormhole_history(operation, table_name, primary_key)
                                VALUES ('insert', 'item', '{"id":1}')
                                """
                        )
                    }
                    let stamp = index < 1234 ? now - 7200 : index < 2000 ? now - 60 : now
                    try db.execute(
                        sql: "INSERT INTO wormhole_history(operation, author, timestamp) VALUES ('commit', 'tests', ?)",
                        arguments: [stamp]
                    )
                    return db.lastInsertedRowID
                }
            }
            try store.read { db in
                for time in [now - 9000, now - 7200, now - 7199, now - 3600, now - 60, now - 59, now, now + 1] {
                    let scanned =
                        try Int64.fetchOne(
                            db,
                            sql: "SELECT MAX(id) FROM wormhole_history WHERE operation = 'commit' AND timestamp < ?",
                            arguments: [time]
                        ) ?? 0
                    #expect(try HistorySchema.lastCommit(db, before: time) == scanned, "before \(time - now) s")
                }
                #expect(try HistorySchema.lastCommit(db, before: now - 3600) == commits[1233])
            }
            // No consumer: what is older than an hour goes.
            #expect(try store.purgeHistory(maximumAge: .seconds(3600)) == 1234)
            #expect(try store.transactions(limit: 1).first?.id == commits[1234])
            // A consumer that merged everything: what is older than the grace goes too, and the rest stays.
            try store.databasePool.write { db in
                try db.execute(
                    sql: "INSERT INTO wormhole_consumer(name, token, seen_at) VALUES ('merged', ?, ?)",
                    arguments: [commits[2999], now]
                )
            }
            #expect(try store.purgeHistory(maximumAge: .seconds(3600)) == 766)
            #expect(try store.transactions(limit: 1).first?.id == commits[2000])
            #expect(try store.transactions(limit: 2000).count == 1000)
        }
    }

    @Test("Four processes writing at once: no lost change, no busy error, every consumer sees every transaction once")
    func fourConcurrentWriters() async throws {
        try await offThePool {
            _ = try open()
            let watchers = try (0..<2).map { index in
                try RunningTool([
                    "store", "watch", path, "--consumer", "watcher\(index)", "--count", "800", "--timeout", "90",
                ])
            }
            for watcher in watchers { #expect(watcher.waitForError(containing: "watching")) }
            let writers = try (0..<4).map { index in
                try RunningTool([
                    "exercise-store", "write", "--path", path, "--count", "200", "--tag", "writer\(index)",
                ])
            }
            for writer in writers {
                let result = writer.finish(timeout: 90)
                #expect(result.status == 0, "\(result.error)")
            }
            for watcher in watchers {
                let result = watcher.finish(timeout: 90)
                #expect(result.status == 0, "\(result.error)")
                let ids = result.lines.compactMap { line in
                    (try? JSONDecoder.iso8601.decode(StoreTransaction.self, from: Data(line.utf8)))?.id
                }
                #expect(ids.count == 800)
                #expect(Set(ids).count == 800, "each transaction once")
                #expect(ids == ids.sorted(), "in commit order")
            }
            let store = try open(author: "checker")
            #expect(try store.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") } == 800)
            // (Not the history's length: the durable watchers purge what they have all merged.)
        }
    }

    @Test("A bad path or name is a clear error")
    func unavailable() async throws {
        try await offThePool {
            try Data().write(to: URL(fileURLWithPath: directory("a-file")))
            let underFile = #expect(throws: StoreError.self) {
                try SharedStore(path: directory("a-file/store.sqlite"), configuration: .init())
            }
            #expect(underFile?.code == .unavailable)
            let badName = #expect(throws: StoreError.self) {
                try SharedStore(applicationGroupIdentifier: "../x", name: "store.sqlite")
            }
            #expect(badName?.code == .unavailable)
        }
    }
}

extension JSONDecoder {
    static var iso8601: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

@Suite("The store demo", .limit(minutes: 3))
struct StoreDemoTests {
    @Test("wormhole demo store: two processes each see the other's increments, and the counter ends at their sum")
    func demoStore() async throws {
        try await offThePool {
            let (status, text, _) = try WormholeTool.runWithOwnGroupRoot(["demo", "store", "--increments", "2"])
            #expect(status == 0, "\(text)")
            #expect(text.contains("The counter is 4"))
            #expect(text.contains("[app]    received transaction"))
            #expect(text.contains("[widget] received transaction"))
            #expect(text.contains("[app]    sees counter = 4") && text.contains("[widget] sees counter = 4"))
        }
    }
}
