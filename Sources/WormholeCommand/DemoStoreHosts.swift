import Foundation
import PostgresNIO
import Synchronization
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `wormhole demo store --hosts`: CDShare's counter, shared by processes on two hosts through a PostgreSQL store.
enum DemoStoreHosts {
    /// The demo's schema and table. `start_signal` lets the parent start both processes at once.
    static let migrations: [PostgresStore.Migration] = [
        .init(
            "counter",
            sql: "CREATE SCHEMA IF NOT EXISTS wormhole_demo",
            "CREATE TABLE counter (id integer PRIMARY KEY, value bigint NOT NULL)",
            "INSERT INTO counter (id, value) VALUES (1, 0)",
            "CREATE TABLE start_signal (id bigserial PRIMARY KEY)"
        )
    ]

    static func open(url: String, group: String, author: String) throws -> PostgresStore {
        try PostgresStore(
            engine: try PostgresEngine(url: url, group: group),
            name: "counter",
            schema: "wormhole_demo",
            migrations: migrations,
            configuration: .init(author: author)
        )
    }

    /// Makes two hosts and a server (or uses `given`), and runs the app and the widget on them.
    static func run(increments: Int, group: String, given: String?) throws {
        let hostsUnavailable = NetworkHosts.unavailableReason()
        let serverUnavailable = LocalPostgresServer.unavailableReason()
        if given == nil, hostsUnavailable == nil, serverUnavailable == nil {
            Output.line("Store demo across hosts: an app and its widget on two hosts share a counter in PostgreSQL.")
            let hosts = try NetworkHosts(count: 2)
            defer { hosts.close() }
            let server = try LocalPostgresServer(listenAddresses: ["127.0.0.1"] + hosts.serverAddresses)
            defer { server.close() }
            Output.line(
                "Hosts: \"app\" at \(hosts.hostAddress(0)) and \"widget\" at \(hosts.hostAddress(1)); PostgreSQL "
                    + "\(server.processIdentifier), reached by each through a link of its own."
            )
            try play(
                url: server.url,
                group: group,
                increments: increments,
                placements: (0..<2).map { Demo.Placement(host: $0, of: hosts, server: server) }
            )
            Output.line("The hosts, their links and the server are removed now.")
            return
        }
        guard let given else {
            throw Output.fail(
                "This machine cannot make two hosts and a server of the demo's own ("
                    + [hostsUnavailable, serverUnavailable].compactMap { $0 }.joined(separator: "; ")
                    + "). Give a PostgreSQL server with --postgres URL or WORMHOLE_POSTGRES_URL."
            )
        }
        Output.line("Store demo through PostgreSQL: an app and its widget, both on this host, share a counter.")
        let placement = Demo.Placement(environment: ["WORMHOLE_POSTGRES_URL": given])
        try play(url: given, group: group, increments: increments, placements: [placement, placement])
    }

    private static func play(url: String, group: String, increments: Int, placements: [Demo.Placement]) throws {
        let store = try open(url: url, group: group, author: "demo")
        try store.write { db in try db.query("UPDATE counter SET value = 0 WHERE id = 1") }
        let start = try store.currentToken()
        Output.line("Store: \(store).")
        Output.line("")
        var children: [ChildProcess] = []
        for (role, placement) in zip(["app", "widget"], placements) {
            let arguments = [
                "demo-role-store", "--group", group, "--increments", String(increments), "--author", role,
            ]
            let child = try Demo.child(arguments, placement, readyLine: "ready") { line in
                Output.line("  [\(role)\(placement.label)]\(role == "app" ? "   " : "") " + line)
            }
            guard child.waitUntilReady(timeout: 20) else { throw Output.fail("the \(role) process did not start") }
            children.append(child)
        }
        try store.write { db in try db.query("INSERT INTO start_signal DEFAULT VALUES") }
        let statuses = children.map { $0.wait(timeout: 60) }
        guard statuses.allSatisfy({ $0 == 0 }) else { throw Output.fail("a demo process failed: \(statuses)") }
        let value = try store.read { db in try db.query("SELECT value FROM counter WHERE id = 1")[0].decode(Int64.self)
        }
        let history = try store.transactions(after: start, limit: 1000)
        Output.line("")
        Output.line(
            "The counter is \(value) (\(2 * increments) increments on two hosts); the history holds \(history.count) "
                + "transactions since, by \(Set(history.map(\.author)).sorted().joined(separator: ", "))."
        )
    }

    /// One process of the demo: waits for the start signal, increments the counter, and prints each transaction of
    /// the other host as it arrives, until it has seen the counter at twice `increments`.
    static func role(url: String, group: String, author: String, increments: Int) throws {
        let store = try open(url: url, group: group, author: author)
        let target = Int64(2 * increments)
        let started = DispatchSemaphore(value: 0)
        let reachedTarget = DispatchSemaphore(value: 0)
        let remote = try store.observeRemoteChanges(consumer: nil, tables: ["counter", "start_signal"]) {
            [store] transaction in
            if transaction.tables["start_signal"] != nil {
                started.signal()
                return
            }
            let value = try store.read { db in
                try db.query("SELECT value FROM counter WHERE id = 1")[0].decode(Int64.self)
            }
            Output.line(
                "received transaction #\(transaction.id) from \(transaction.author): the counter is now \(value)"
            )
            if value == target { reachedTarget.signal() }
        }
        Output.line("ready")
        guard started.wait(timeout: .now() + 20) == .success else { throw Output.fail("no start signal") }
        for _ in 0..<increments {
            let value = try store.write { db in
                try db.query("UPDATE counter SET value = value + 1 WHERE id = 1 RETURNING value")[0].decode(Int64.self)
            }
            Output.line("incremented the counter to \(value)")
            if value == target { reachedTarget.signal() }
            Thread.sleep(forTimeInterval: 0.15)
        }
        guard reachedTarget.wait(timeout: .now() + 20) == .success else {
            throw Output.fail("never saw the counter reach \(target)")
        }
        remote.cancel()
    }
}
