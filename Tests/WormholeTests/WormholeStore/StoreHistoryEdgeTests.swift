import Foundation
import GRDB
import Testing
import WormholeCLI
import WormholeKit

@testable import WormholeStore

/// What a review of the store found its history recording wrong: a changed primary key, a renamed table, a virtual
/// table, another tool's transaction left unannounced, a link at the database's path, and purging past a live
/// consumer. Each test fails without its fix.
@Suite(
    "Shared store history: changed keys, renamed and virtual tables, other tools, links, purging",
    .limit(minutes: 2)
)
struct StoreHistoryEdgeTests {
    let directory = TemporaryDirectory()
    var path: String { directory("store.sqlite") }

    func open(author: String = "tests", _ migrations: [(String, String)] = []) throws -> SharedStore {
        var migrator = SharedStoreTests.migrator
        for (name, sql) in migrations { migrator.registerMigration(name) { db in try db.execute(sql: sql) } }
        return try SharedStore(path: path, migrator: migrator, configuration: .init(author: author))
    }

    @Test("A changed primary key is recorded as the old key deleted and the new one inserted")
    func changedPrimaryKey() async throws {
        try await offThePool {
            let store = try open()
            try store.write { db in try db.execute(sql: "INSERT INTO tag(name, color) VALUES ('red', '#f00')") }
            try store.write { db in try db.execute(sql: "UPDATE tag SET name = 'blue' WHERE name = 'red'") }
            try store.write { db in try db.execute(sql: "UPDATE tag SET color = '#00f' WHERE name = 'blue'") }
            let history = try store.transactions()
            #expect(history.count == 3)
            #expect(history[1].tables["tag"]?.deleted == [PrimaryKey(["name": .text("red")])])
            #expect(history[1].tables["tag"]?.inserted == [PrimaryKey(["name": .text("blue")])])
            #expect(history[1].tables["tag"]?.updated.isEmpty == true)
            #expect(history[2].tables["tag"]?.updated == [PrimaryKey(["name": .text("blue")])])
        }
    }

    @Test("A renamed table is recorded once, under its new name, and a new table of the old name is tracked")
    func renamedTable() async throws {
        try await offThePool {
            try open().write { db in try db.execute(sql: "INSERT INTO tag(name, color) VALUES ('red', '#f00')") }
            let store = try open([
                ("rename", "ALTER TABLE tag RENAME TO label"),
                ("new tag", "CREATE TABLE tag (id INTEGER PRIMARY KEY, text TEXT)"),
            ])
            try store.write { db in
                try db.execute(sql: "INSERT INTO label(name, color) VALUES ('green', '#0f0')")
                try db.execute(sql: "INSERT INTO tag(id, text) VALUES (5, 'new')")
            }
            let last = try #require(try store.transactions().last)
            #expect(last.tables["label"]?.inserted == [PrimaryKey(["name": .text("green")])])
            #expect(last.tables["tag"]?.inserted == [PrimaryKey(["id": .integer(5)])], "\(last.tables)")
            // Opened again, nothing is made again: the triggers' text is the one this version makes.
            let triggers = try store.read { db in
                try String.fetchAll(db, sql: "SELECT sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
            }
            let again = try open([
                ("rename", "ALTER TABLE tag RENAME TO label"),
                ("new tag", "CREATE TABLE tag (id INTEGER PRIMARY KEY, text TEXT)"),
            ])
            #expect(
                try again.read { db in
                    try String.fetchAll(db, sql: "SELECT sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
                } == triggers
            )
        }
    }

    @Test("A store with a full-text (virtual) table opens, and neither it nor its shadow tables are recorded")
    func virtualTable() async throws {
        try await offThePool {
            let store = try open([("notes", "CREATE VIRTUAL TABLE notes USING fts5(body)")])
            try store.write { db in
                try db.execute(sql: "INSERT INTO notes(body) VALUES ('hello')")
                try db.execute(sql: "INSERT INTO tag(name, color) VALUES ('red', '#f00')")
            }
            let last = try #require(try store.transactions().last)
            #expect(Set(last.tables.keys) == ["tag"])
        }
    }

    @Test("Another tool's transaction is announced by the next store write, even one that records nothing")
    func externalTransactionAnnounced() async throws {
        try await offThePool {
            let writer = try open(author: "writer")
            let watcher = try open(author: "watcher")
            let received = Collector<String>()
            let observer = try watcher.observeRemoteChanges(consumer: nil, on: .notifierThread) {
                received.append($0.author)
            }
            // Another tool: a connection of its own, which the store's triggers record but nobody announces.
            let tool = try DatabaseQueue(path: path)
            try tool.write { db in try db.execute(sql: "INSERT INTO tag(name, color) VALUES ('red', '#f00')") }
            try tool.close()
            try writer.write { _ in }
            #expect(eventually { received.values == ["external"] })
            observer.cancel()
        }
    }

    @Test("A symbolic link at the database's path is refused, not followed")
    func linkAtTheDatabasePath() throws {
        let target = directory("elsewhere.sqlite")
        try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: target)
        #expect {
            try open()
        } throws: { error in
            (error as? StoreError)?.code == .unavailable
        }
        #expect(!FileManager.default.fileExists(atPath: target))
    }

    @Test("Purging by age keeps what a registered consumer, seen lately, has not merged")
    func purgeKeepsWhatALiveConsumerNeeds() async throws {
        try await offThePool {
            let store = try open()
            let waiting = store.remoteChanges(consumer: "slow")
            for index in 0..<3 {
                try store.write { db in
                    try db.execute(sql: "INSERT INTO tag(name, color) VALUES (?, '#f00')", arguments: ["t\(index)"])
                }
            }
            // Made two hours old: older than the hour given below.
            try store.write { db in try db.execute(sql: "UPDATE wormhole_history SET timestamp = timestamp - 7200") }
            try store.purgeHistory(maximumAge: .seconds(3600))
            #expect(try store.transactions().count == 3)
            _ = waiting
        }
    }
}
