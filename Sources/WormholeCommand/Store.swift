import ArgumentParser
import Foundation
import GRDB
import Synchronization
import WormholeCLI
import WormholeKit
import WormholeStore

/// `wormhole store …`: look into a shared store's history and watch other processes' commits.
struct StoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Read a shared SQLite store's history, watch its remote changes, run SQL through it.",
        discussion: """
            STORE is the path of a database file (anything with a '/'), or an application group identifier, in \
            which case --name names the file in the group's container (store.sqlite by default).
            """,
        subcommands: [StoreHistory.self, StoreWatch.self, StoreSQL.self, StorePurge.self]
    )
}

struct StoreLocation: ParsableArguments {
    @Argument(help: ArgumentHelp("The database's path, or an application group identifier.", valueName: "store"))
    var store: String

    @Option(help: "With a group: the database's file name.")
    var name = "store.sqlite"

    @Option(help: "With a group: a subdirectory of the group's container.")
    var optionalDirectory: String?

    @Option(help: "Who this process is in the history.")
    var author = "wormhole-cli"

    var path: String {
        get throws {
            if store.contains("/") { return store }
            let directory = try GroupContainer.directory(
                forApplicationGroupIdentifier: store,
                optionalDirectory: optionalDirectory
            )
            return directory + "/" + name
        }
    }

    func open() throws -> SharedStore {
        try SharedStore(path: path, configuration: .init(author: author, observesRemoteChanges: false))
    }
}

/// One JSON line per transaction.
enum StoreOutput {
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }()

    static func line(_ transaction: StoreTransaction) -> String {
        String(decoding: (try? encoder.encode(transaction)) ?? Data(), as: UTF8.self)
    }
}

struct StoreHistory: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "Print the recorded transactions, one JSON object a line, oldest first."
    )

    @OptionGroup var location: StoreLocation

    @Option(help: "Only transactions after this history token.")
    var after: Int64 = 0

    @Option(help: "At most this many transactions (the newest ones, unless --after is given).")
    var limit = 50

    func run() throws {
        let store = try location.open()
        var start = after
        if after == 0 { start = max(0, try store.currentToken() - Int64(limit)) }
        for transaction in try store.transactions(after: start, limit: limit) {
            Output.line(StoreOutput.line(transaction))
        }
    }
}

struct StoreWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print each transaction other processes commit, one JSON line each, as it commits.",
        discussion: """
            With --consumer, the history token is stored under that name: a later watch with the same name resumes \
            after the last transaction printed. "watching STORE" goes to standard error when ready. Damaged \
            history rows are reported on standard error and the rest is printed.
            """
    )

    @OptionGroup var location: StoreLocation

    @Option(help: "A durable consumer name.")
    var consumer: String?

    @Option(name: .customLong("table"), help: "A table in scope (repeat for several); all tables by default.")
    var tables: [String] = []

    @Flag(help: "Also print transactions written with this --author.")
    var includeOwn = false

    @OptionGroup var limits: ListeningLimits

    func run() throws {
        let store = try location.open()
        try limits.listen(ready: "watching \(location.store)") { tally in
            try store.observeRemoteChanges(
                consumer: consumer,
                tables: tables.isEmpty ? nil : Set(tables),
                includingOwnWrites: includeOwn,
                errorHandler: { Output.error("\($0)") }
            ) { transaction in
                // Once the limit is reached, refuse the rest: they stay unmerged for the next watch.
                guard !tally.isReached else { throw CancellationError() }
                Output.line(StoreOutput.line(transaction))
                tally.add()
            }
        }
    }
}

struct StoreSQL: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql",
        abstract: "Run SQL through the store: recorded in the history, other processes notified.",
        discussion: "With --query, prints each row of a SELECT as a JSON object instead."
    )

    @OptionGroup var location: StoreLocation

    @Argument(help: "The SQL statements.")
    var sql: String

    @Flag(help: "Run a query and print its rows.")
    var query = false

    func run() throws {
        let store = try location.open()
        if query {
            let rows = try store.read { db in try Row.fetchAll(db, sql: sql) }
            for row in rows {
                var object: [String: Any] = [:]
                for (column, value) in row {
                    switch value.storage {
                    case .null: object[column] = NSNull()
                    case .int64(let number): object[column] = number
                    case .double(let number): object[column] = number
                    case .string(let text): object[column] = text
                    case .blob(let data): object[column] = data.base64EncodedString()
                    }
                }
                let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
                Output.line(String(decoding: data, as: UTF8.self))
            }
        } else {
            try store.write { db in try db.execute(sql: sql) }
        }
    }
}

struct StorePurge: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "purge",
        abstract: "Delete history every consumer has merged, and consumers gone too long."
    )

    @OptionGroup var location: StoreLocation

    @Option(help: "Drop consumers not seen for this many seconds (default: 7 days).")
    var maxAge: Double?

    func run() throws {
        let removed = try location.open().purgeHistory(maximumAge: maxAge.map { .milliseconds(Int64($0 * 1000)) })
        Output.line("purged \(removed) transactions")
    }
}
