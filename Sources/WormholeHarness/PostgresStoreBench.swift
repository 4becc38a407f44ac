import ArgumentParser
import Foundation
import NIOPosix
import PostgresNIO
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `pg-store-bench`: what a PostgreSQL store costs, in one run against one server (issue goals: history at most
/// 1.5× a plain insert transaction through postgres-nio; a remote change received at p50 under 3 ms on loopback).
///
/// - History: one-row insert transactions (BEGIN, INSERT, COMMIT: three round trips) through `PostgresStore.write`,
///   whose triggers record the history, against the same statements on a table without triggers through a plain
///   postgres-nio connection; rounds alternate, and the figure is the median of the rounds' ratios.
/// - Remote change: a writer store (its own engine and connections) commits one row at a time; a consumer store (its
///   own engine, its own LISTEN connection) observes on the notifier thread. Latency runs from the call of `write`
///   (so it includes the commit) to the consumer's handler.
struct PostgresStoreBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pg-store-bench",
        abstract: "Measure the PostgreSQL store's history cost and remote-change latency.",
        shouldDisplay: false
    )

    @Option(help: "A server to use; by default one of its own (durable unless --fast).") var postgres: String?
    @Flag(help: "With a server of its own: fsync and synchronous_commit off.") var fast = false
    @Option(help: "Transactions per round and per side.") var count = 500
    @Option(help: "Rounds, the two sides taking turns.") var rounds = 5
    @Option(help: "Remote changes measured.") var changes = 1_000

    func run() throws {
        var server: LocalPostgresServer?
        let url: String
        if let postgres {
            url = postgres
        } else {
            let own = try LocalPostgresServer(durable: !fast)
            server = own
            url = own.url
        }
        defer { server?.close() }
        let group = "bench.store.\(UInt32.random(in: 0...UInt32.max))"
        let schema = "bench_" + String(UInt32.random(in: 0...UInt32.max))
        func open(_ author: String) throws -> PostgresStore {
            try PostgresStore(
                engine: try PostgresEngine(url: url, group: group),
                name: "bench",
                schema: schema,
                migrations: [
                    .init(
                        "v1",
                        sql: "CREATE SCHEMA IF NOT EXISTS \(schema)",
                        "CREATE TABLE item (id bigserial PRIMARY KEY, value bigint NOT NULL)",
                        "CREATE TABLE plain (id bigserial PRIMARY KEY, value bigint NOT NULL)"
                    )
                ],
                configuration: .init(author: author, untrackedTables: ["plain"])
            )
        }
        let writer = try open("writer")
        let plain = try PlainConnection(url: url, schema: schema)
        defer { plain.close() }
        Output.line(
            "PostgreSQL store benchmark: \(server == nil ? url : (fast ? "own server, fast" : "own server, durable"))"
        )

        // History cost.
        var ratios: [Double] = []
        var storeMeans: [Double] = []
        var plainMeans: [Double] = []
        for round in 0..<(rounds + 1) {
            let storeTime = try time(count) { (value: Int64) throws -> Void in
                let insert: (PostgresStore.StoreConnection) throws -> Void = { db in
                    try db.query("INSERT INTO item (value) VALUES (\(value))")
                }
                try writer.write(insert)
            }
            let plainTime = try time(count) { (value: Int64) throws -> Void in
                try plain.run("BEGIN")
                try plain.run("INSERT INTO plain (value) VALUES (\(value))")
                try plain.run("COMMIT")
            }
            if round == 0 { continue }  // warm-up
            storeMeans.append(storeTime)
            plainMeans.append(plainTime)
            ratios.append(storeTime / plainTime)
        }
        Output.line(
            String(
                format: "history: store write %.0f µs, plain insert transaction %.0f µs a transaction (medians of %d "
                    + "rounds of %d); ratio %.2f (median of the rounds' ratios, goal ≤ 1.5)",
                median(storeMeans),
                median(plainMeans),
                rounds,
                count,
                median(ratios)
            )
        )

        // Remote-change latency.
        let consumer = try open("consumer")
        let started = Locked<[Int64: UInt64]>([:])
        let latencies = Locked<[UInt64]>([])
        let done = DispatchSemaphore(value: 0)
        let total = changes
        let observer = try consumer.observeRemoteChanges(consumer: nil, tables: ["item"], on: .notifierThread) {
            transaction in
            let now = monotonicNanoseconds()
            guard let key = transaction.tables["item"]?.inserted.first?.integerValue else { return }
            let start = started.withLock { $0[key] }
            guard let start else { return }
            let count = latencies.withLock {
                $0.append(now - start)
                return $0.count
            }
            if count == total { done.signal() }
        }
        var writes: [UInt64] = []
        for _ in 0..<changes {
            let start = monotonicNanoseconds()
            defer { writes.append(monotonicNanoseconds() - start) }
            let insert: (PostgresStore.StoreConnection) throws -> Void = { db in
                let key = try db.query("INSERT INTO item (value) VALUES (0) RETURNING id")[0].decode(Int64.self)
                started.withLock { $0[key] = start }
            }
            try writer.write(insert)
            Thread.sleep(forTimeInterval: 0.001)
        }
        _ = done.wait(timeout: .now() + 60)
        observer.cancel()
        // What a consumer's read of one new transaction costs, alone.
        var reads: [UInt64] = []
        let last = try consumer.currentToken()
        for _ in 0..<200 {
            let start = monotonicNanoseconds()
            _ = try consumer.transactions(after: last - 1, limit: 100)
            reads.append(monotonicNanoseconds() - start)
        }
        let samples = LatencySamples(latencies.withLock { $0 })
        Output.line(
            String(
                format: "  of which: the write itself p50 %.2f ms; a consumer's read of one transaction p50 %.2f ms",
                LatencySamples(writes).p50 / 1000,
                LatencySamples(reads).p50 / 1000
            )
        )
        Output.line(
            String(
                format: "remote change: commit on one store to the transaction received by another: p50 %.2f ms, "
                    + "p99 %.2f ms over %d (goal p50 < 3 ms)",
                samples.p50 / 1000,
                samples.p99 / 1000,
                samples.values.count
            )
        )
    }

    /// The mean time of `count` calls of `body`, in microseconds.
    private func time(_ count: Int, _ body: (Int64) throws -> Void) throws -> Double {
        let start = monotonicNanoseconds()
        for value in 0..<count { try body(Int64(value)) }
        return Double(monotonicNanoseconds() - start) / Double(count) / 1000
    }

    private func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted.isEmpty ? .nan : sorted[sorted.count / 2]
    }
}

/// One plain postgres-nio connection, waited on from this thread: the baseline.
final class PlainConnection {
    let connection: PostgresConnection
    let logger = Logger(label: "bench.plain")

    init(url: String, schema: String) throws {
        var configuration = try PostgresLocation(url: url).configuration
        configuration.options.additionalStartupParameters += [("search_path", schema)]
        connection = try PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.next(),
            configuration: configuration,
            id: 1,
            logger: logger
        ).wait()
    }

    func run(_ query: PostgresQuery) throws {
        _ = try connection.query(query, logger: logger).wait()
    }

    func close() { try? connection.close().wait() }
}
