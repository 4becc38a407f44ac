import ArgumentParser
import Foundation
import GRDB
import PostgresNIO
import Synchronization
import WormholeCLI
import WormholeKit
import WormholePostgres
import WormholeStore

/// `wormhole store …`: look into a shared store's history and watch other processes' commits.
struct StoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Read a shared store's history, watch its remote changes, run SQL through it.",
        discussion: """
            STORE is the path of a SQLite database file (anything with a '/'), or an application group identifier, \
            in which case --name names the file in the group's container (store.sqlite by default). With --postgres \
            URL (or WORMHOLE_POSTGRES_URL), STORE is the group and --name the store's name on that server (store by \
            default), its tables in --schema.
            """,
        subcommands: [StoreHistory.self, StoreWatch.self, StoreSQL.self, StorePurge.self]
    )
}

struct StoreLocation: ParsableArguments {
    @Argument(help: ArgumentHelp("The database's path, or an application group identifier.", valueName: "store"))
    var store: String

    @Option(help: "With a group: the database's file name (store.sqlite), or the store's name on --postgres (store).")
    var name: String?

    @Option(help: "With a group: a subdirectory of the group's container.")
    var optionalDirectory: String?

    @Option(help: "Who this process is in the history.")
    var author = "wormhole-cli"

    @Option(
        help: ArgumentHelp(
            "A PostgreSQL server: STORE is then a group and --name a store of it on this server.",
            discussion: "postgres://USER:PASSWORD@HOST:PORT/DATABASE?sslmode=MODE; WORMHOLE_POSTGRES_URL when unset.",
            valueName: "url"
        )
    )
    var postgres: String?

    @Option(help: "With --postgres: the PostgreSQL schema of the store's tables.")
    var schema = "public"

    var postgresURL: String? {
        postgres ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
    }

    var path: String {
        get throws {
            if store.contains("/") { return store }
            let directory = try GroupContainer.directory(
                forApplicationGroupIdentifier: store,
                optionalDirectory: optionalDirectory
            )
            return directory + "/" + (name ?? "store.sqlite")
        }
    }

    /// Opens the store; with `tracking` false (reading the history), a PostgreSQL store's tables are left as they
    /// are.
    func open(tracking: Bool = true) throws -> OpenedStore {
        guard let postgresURL else {
            return .sqlite(
                try SharedStore(path: path, configuration: .init(author: author, observesRemoteChanges: false))
            )
        }
        let engine = try PostgresEngine(url: postgresURL, group: store)
        return .postgres(
            try PostgresStore(
                engine: engine,
                name: name ?? "store",
                schema: schema,
                configuration: .init(author: author, tracksTables: tracking)
            )
        )
    }
}

/// A store the tool opened: SQLite on this host, or PostgreSQL.
enum OpenedStore {
    case sqlite(SharedStore)
    case postgres(PostgresStore)

    func currentToken() throws -> Int64 {
        switch self {
        case .sqlite(let store): try store.currentToken()
        case .postgres(let store): try store.currentToken()
        }
    }

    func transactions(after token: Int64, limit: Int) throws -> [StoreTransaction] {
        switch self {
        case .sqlite(let store): try store.transactions(after: token, limit: limit)
        case .postgres(let store): try store.transactions(after: token, limit: limit)
        }
    }

    func observeRemoteChanges(
        consumer: String?,
        tables: Set<String>?,
        includingOwnWrites: Bool,
        errorHandler: @escaping @Sendable (StoreError) -> Void,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void
    ) throws -> RemoteChangeObserver {
        switch self {
        case .sqlite(let store):
            try store.observeRemoteChanges(
                consumer: consumer,
                tables: tables,
                includingOwnWrites: includingOwnWrites,
                errorHandler: errorHandler,
                handler: handler
            )
        case .postgres(let store):
            try store.observeRemoteChanges(
                consumer: consumer,
                tables: tables,
                includingOwnWrites: includingOwnWrites,
                errorHandler: errorHandler,
                handler: handler
            )
        }
    }

    /// Runs the statements in one transaction; on PostgreSQL, tables they create are tracked from then on.
    func execute(_ statements: [String]) throws {
        switch self {
        case .sqlite(let store):
            try store.write { db in for statement in statements { try db.execute(sql: statement) } }
        case .postgres(let store):
            try store.write { db in
                for statement in statements { try db.query(PostgresQuery(unsafeSQL: statement)) }
            }
            try store.trackNewTables()
        }
    }

    /// The rows of a query, each as a JSON object.
    func query(_ sql: String) throws -> [String] {
        switch self {
        case .sqlite(let store):
            let rows = try store.read { db in try Row.fetchAll(db, sql: sql) }
            return try rows.map { row in
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
                return String(decoding: data, as: UTF8.self)
            }
        case .postgres(let store):
            // The server writes each row as JSON: the query is the user's, run as a subquery.
            return try store.read { db in
                let query = sql.trimmingCharacters(in: .whitespacesAndNewlines.union(CharacterSet(charactersIn: ";")))
                return try db.query("SELECT row_to_json(q)::text FROM (\(unescaped: query)) q").map { row in
                    try row.decode(String.self)
                }
            }
        }
    }

    func purgeHistory(maximumAge: Duration?) throws -> Int {
        switch self {
        case .sqlite(let store): try store.purgeHistory(maximumAge: maximumAge)
        case .postgres(let store): try store.purgeHistory(maximumAge: maximumAge)
        }
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
        let store = try location.open(tracking: false)
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
        let store = try location.open(tracking: false)
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
        discussion: """
            With --query, prints each row of a SELECT as a JSON object instead. On PostgreSQL, a table the \
            statements create is tracked once they commit: rows written to it in the same call are not recorded.
            """
    )

    @OptionGroup var location: StoreLocation

    @Argument(help: "The SQL statements, one an argument (a SQLite argument may hold several), run in one transaction.")
    var sql: [String]

    @Flag(help: "Run a query and print its rows.")
    var query = false

    func validate() throws {
        if query && sql.count != 1 { throw ValidationError("--query takes one SQL statement.") }
    }

    func run() throws {
        let store = try location.open()
        if query {
            for line in try store.query(sql[0]) { Output.line(line) }
        } else {
            try store.execute(sql)
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

    func validate() throws {
        if let maxAge, !(maxAge > 0) { throw ValidationError("--max-age must be a positive number of seconds.") }
    }

    func run() throws {
        let removed = try location.open(tracking: false).purgeHistory(
            maximumAge: maxAge.map { .milliseconds(Int64($0 * 1000)) }
        )
        Output.line("purged \(removed) transactions")
    }
}
