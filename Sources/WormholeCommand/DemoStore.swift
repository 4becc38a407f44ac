import ArgumentParser
import Foundation
import GRDB
import Synchronization
import WormholeCLI
import WormholeKit
import WormholeStore

/// `wormhole demo store`: CDShare's example, two processes sharing a `Counter` table.
struct DemoStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Show two processes sharing one store, each seeing the other's increments live.",
        discussion: """
            Creates counter.sqlite in the demo group's container with a table `counter`, then starts an "app" and a \
            "widget" process. Each increments the counter several times; each watches the counter with a GRDB \
            ValueObservation, which fires for the other process's commits too, and receives the other's \
            transactions from the history.

            With --hosts, the two processes run on two hosts (network namespaces the demo makes, where the machine \
            allows it) and share a PostgreSQL store on a server of the demo's own, or on --postgres URL.
            """
    )

    @Option(help: "How many times each process increments the counter.")
    var increments = 3

    @Option(help: "The application group to use.")
    var group = DemoDefaults.group

    @Flag(help: "Run the two processes on two hosts, sharing a PostgreSQL store.")
    var hosts = false

    @Option(
        help: ArgumentHelp(
            "With --hosts: a PostgreSQL server to use instead of one of the demo's own (both processes on this host).",
            valueName: "url"
        )
    )
    var postgres: String?

    func validate() throws {
        if increments < 1 || increments > 1000 { throw ValidationError("--increments must be between 1 and 1000.") }
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("counter") { db in
            try db.execute(sql: "CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER NOT NULL)")
            try db.execute(sql: "INSERT INTO counter (id, value) VALUES (1, 0)")
            // The parent inserts a row here to start both processes at once.
            try db.execute(sql: "CREATE TABLE start_signal (id INTEGER PRIMARY KEY)")
        }
        return migrator
    }

    func run() throws {
        if hosts || postgres != nil {
            let given =
                postgres
                ?? ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
            return try DemoStoreHosts.run(increments: increments, group: group, given: given)
        }
        let directory = try GroupContainer.directory(
            forApplicationGroupIdentifier: group,
            optionalDirectory: DemoDefaults.optionalDirectory
        )
        let path = directory + "/counter.sqlite"
        // A fresh database for each run of the demo.
        for suffix in ["", "-wal", "-shm", ".wormhole-lock"] {
            try? FileManager.default.removeItem(atPath: path + suffix)
        }
        let store = try SharedStore(path: path, migrator: Self.migrator, configuration: .init(author: "demo"))
        Output.line("Store demo: two processes share \(path)")
        Output.line("")

        let arguments = ["demo-role-store", "--path", path, "--increments", String(increments)]
        var children: [ChildProcess] = []
        for role in ["app", "widget"] {
            let child = try ChildProcess(arguments: arguments + ["--author", role], readyLine: "ready") { line in
                Output.line("  [\(role)]\(role == "app" ? "   " : "") " + line)
            }
            guard child.waitUntilReady(timeout: 10) else { throw Output.fail("the \(role) process did not start") }
            children.append(child)
        }
        // Both are watching: let them go at once.
        try store.write { db in try db.execute(sql: "INSERT INTO start_signal DEFAULT VALUES") }
        let statuses = children.map { $0.wait(timeout: 30) }
        guard statuses.allSatisfy({ $0 == 0 }) else { throw Output.fail("a demo process failed: \(statuses)") }

        let value = try store.read { db in try Int.fetchOne(db, sql: "SELECT value FROM counter WHERE id = 1") ?? -1 }
        let history = try store.transactions(limit: 1000)
        Output.line("")
        Output.line(
            "The counter is \(value) (\(2 * increments) increments by two processes); the history holds "
                + "\(history.count) transactions, by \(Set(history.map(\.author)).sorted().joined(separator: ", "))."
        )
    }
}

/// One process of the store demo; hidden from help.
struct DemoRoleStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-role-store",
        abstract: "Run one process of the store demo.",
        shouldDisplay: false
    )

    @Option var path: String?
    @Option var group: String?
    @Option var author: String
    @Option var increments = 3

    func run() throws {
        if let group, let url = ProcessInfo.processInfo.environment["WORMHOLE_POSTGRES_URL"] {
            return try DemoStoreHosts.role(url: url, group: group, author: author, increments: increments)
        }
        guard let path else { throw Output.fail("demo-role-store needs --path, or --group and WORMHOLE_POSTGRES_URL") }
        let store = try SharedStore(path: path, migrator: DemoStore.migrator, configuration: .init(author: author))
        let target = 2 * increments
        let reachedTarget = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        let lastSeen = Locked(-1)

        // GRDB observation: fires for this process's commits and, through the store, for the other process's.
        let observation = ValueObservation.tracking { db in
            try Int.fetchOne(db, sql: "SELECT value FROM counter WHERE id = 1") ?? 0
        }
        let cancellable = observation.start(
            in: store.databasePool,
            scheduling: .async(onQueue: DispatchQueue(label: "demo.observation")),
            onError: { Output.line("observation failed: \($0)") },
            onChange: { value in
                let changed = lastSeen.withLock { last in
                    defer { last = value }
                    return last != value
                }
                guard changed else { return }
                Output.line("sees counter = \(value)")
                if value == target { reachedTarget.signal() }
            }
        )

        // The history: which process changed what.
        let remote = try store.observeRemoteChanges(consumer: nil) { transaction in
            if transaction.tableNames == ["start_signal"] {
                started.signal()
                return
            }
            if transaction.tables["counter"] != nil {
                Output.line("received transaction #\(transaction.id) from \(transaction.author)")
            }
        }
        Output.line("ready")
        guard started.wait(timeout: .now() + 10) == .success else { throw Output.fail("no start signal") }
        for _ in 0..<increments {
            try store.write { db in try db.execute(sql: "UPDATE counter SET value = value + 1 WHERE id = 1") }
            Output.line("incremented the counter")
            Thread.sleep(forTimeInterval: 0.15)
        }
        guard reachedTarget.wait(timeout: .now() + 15) == .success else {
            throw Output.fail("never saw the counter reach \(target)")
        }
        remote.cancel()
        cancellable.cancel()
    }
}
