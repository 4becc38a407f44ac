import ArgumentParser
import Foundation
import GRDB
import Synchronization
import WormholeCLI
import WormholeKit
import WormholeStore

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// `wormhole bench store`: the shared store's figures, each against its baseline in the same run.
struct BenchStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Measure the shared store: remote-change latency, the cost of history, concurrent writers.",
        discussion: """
            1. Remote-change latency: process A commits a row; process B receives the transaction from the history \
            and commits an answer; one-way latency is from the start of A's write to B's handler (one monotonic \
            clock serves both processes). 2. The cost of history: single-row insert transactions through the store \
            (history recorded, other processes notified) against plain GRDB writes to an untracked table of the \
            same database, alternating in blocks. 3. Concurrent writers: 4 processes insert at once while 2 \
            durable consumers watch; counts what was lost, duplicated, or failed with SQLITE_BUSY. 4. A purge's \
            lookups while a consumer that is away holds the history (nothing to delete), against the scan of the \
            commits' times that purges made before, on the same database.
            """
    )

    @Option(help: "Round trips for the latency figure (after the warm-up).")
    var roundTrips = 1000

    @Option(help: "Warm-up round trips, not counted.")
    var warmUp = 100

    @Option(help: "Insert transactions for the cost of history, for each side.")
    var inserts = 10_000

    @Option(help: "Transactions each of the 4 concurrent writer processes commits.")
    var perWriter = 500

    @Option(help: "Transactions kept in the history for the purge's figure.")
    var keptTransactions = 300_000

    @Option(parsing: .upToNextOption, help: "Directories to measure in; 'default' is the default group root.")
    var locations: [String] = ["default", "/dev/shm"]

    static var migrator: DatabaseMigrator {
        var migrator = StoreFixtures.itemsMigrator
        migrator.registerMigration("bench") { db in
            try db.execute(sql: "CREATE TABLE ping (id INTEGER PRIMARY KEY, sent_at INTEGER NOT NULL)")
            try db.execute(sql: "CREATE TABLE pong (id INTEGER PRIMARY KEY, received_at INTEGER NOT NULL)")
            try db.execute(
                sql: "CREATE TABLE plain_item (id INTEGER PRIMARY KEY AUTOINCREMENT, writer TEXT, value INTEGER)"
            )
        }
        return migrator
    }

    static func configuration(author: String) -> SharedStore.Configuration {
        .init(author: author, untrackedTables: ["plain_item"], observesRemoteChanges: false)
    }

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(0)
        #endif
        #if DEBUG
        Output.line("warning: a debug build; run `swift run -c release wormhole bench store` for real figures")
        #endif
        Output.line(
            "wormhole bench store: both processes on CPU 0; \(roundTrips) round trips, \(inserts) inserts a side"
        )
        for location in locations {
            let (base, label) = try makeBenchDirectory(location, prefix: "wormhole-store-bench")
            defer { try? FileManager.default.removeItem(atPath: base) }
            Output.line("")
            Output.line("\(label):")
            try measureLatency(path: base + "/latency.sqlite")
            try measureHistoryCost(path: base + "/cost.sqlite")
            try measureConcurrentWriters(path: base + "/writers.sqlite")
            try measurePurge(path: base + "/purge.sqlite")
        }
    }

    private func measureLatency(path: String) throws {
        let store = try SharedStore(
            path: path,
            migrator: Self.migrator,
            configuration: Self.configuration(author: "bench")
        )
        let peer = try ChildProcess(arguments: ["bench-peer-store", "--path", path], readyLine: "ready") { line in
            Output.line("peer: " + line)
        }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the store peer did not start") }
        let total = warmUp + roundTrips
        let counted = warmUp
        let samples = Locked<[UInt64]>([])
        let done = DispatchSemaphore(value: 0)
        let failure = Locked<(any Error)?>(nil)
        @Sendable func ping(_ id: Int) throws {
            let start = monotonicNanoseconds()
            try store.write { db in
                try db.execute(sql: "INSERT INTO ping(id, sent_at) VALUES (?, ?)", arguments: [id, Int64(start)])
            }
        }
        let observer = try store.observeRemoteChanges(consumer: nil, tables: ["pong"]) { transaction in
            guard let id = transaction.tables["pong"]?.inserted.first?.integerValue else { return }
            do {
                let row = try store.read { db in
                    try Row.fetchOne(
                        db,
                        sql: "SELECT ping.sent_at, pong.received_at FROM ping JOIN pong USING (id) WHERE id = ?",
                        arguments: [id]
                    )
                }
                if let row, id >= counted {
                    let sent: Int64 = row["sent_at"]
                    let received: Int64 = row["received_at"]
                    samples.withLock { $0.append(UInt64(max(0, received - sent))) }
                }
                if Int(id) + 1 >= total {
                    done.signal()
                    return
                }
                try ping(Int(id) + 1)
            } catch {
                failure.withLock { $0 = error }
                done.signal()
            }
        }
        try ping(0)
        guard done.wait(timeout: .now() + 300) == .success else { throw Output.fail("the store ping-pong stalled") }
        observer.cancel()
        if let error = failure.withLock({ $0 }) { throw error }
        let figures = LatencySamples(samples.withLock { $0 })
        Output.line(
            String(
                format:
                    "  remote change, commit in A → transaction received in B: p50 %.0f µs, p99 %.0f µs (%d samples)",
                figures.p50,
                figures.p99,
                figures.values.count
            )
        )
    }

    private func measureHistoryCost(path: String) throws {
        let store = try SharedStore(
            path: path,
            migrator: Self.migrator,
            configuration: Self.configuration(author: "bench")
        )
        let pool = store.databasePool
        var recorded: UInt64 = 0
        var plain: UInt64 = 0
        let block = 500
        var done = 0
        while done < inserts {
            let count = min(block, inserts - done)
            var start = monotonicNanoseconds()
            for index in 0..<count {
                try pool.write { db in
                    try db.cachedStatement(sql: "INSERT INTO plain_item(writer, value) VALUES ('plain', ?)")
                        .execute(arguments: [index])
                }
            }
            plain += monotonicNanoseconds() - start
            start = monotonicNanoseconds()
            for index in 0..<count {
                try store.write { db in
                    try db.cachedStatement(sql: "INSERT INTO item(writer, value) VALUES ('store', ?)")
                        .execute(arguments: [index])
                }
            }
            recorded += monotonicNanoseconds() - start
            done += count
        }
        // Where the difference goes: the same inserts with each part of the store's write added in turn.
        let steps = min(inserts, 3000)
        func timed(_ body: (Int) throws -> Void) rethrows -> Double {
            let start = monotonicNanoseconds()
            for index in 0..<steps { try body(index) }
            return Double(monotonicNanoseconds() - start) / Double(steps) / 1000
        }
        let untracked = try timed { index in
            try pool.write { db in
                try db.cachedStatement(sql: "INSERT INTO plain_item(writer, value) VALUES ('p', ?)").execute(
                    arguments: [index])
            }
        }
        let triggerOnly = try timed { index in
            try pool.write { db in
                try db.cachedStatement(sql: "INSERT INTO item(writer, value) VALUES ('t', ?)").execute(arguments: [
                    index
                ])
            }
        }
        // Close what the trigger-only writes left, so that they do not count as one huge external transaction.
        try store.write { _ in }
        let notifyOnly = try timed { _ in try store.notifier.post("bench.breakdown") }
        Output.line(
            String(
                format: "  where the time goes, µs a transaction: plain GRDB %.1f; with the history trigger %.1f; "
                    + "notification post %.1f",
                untracked,
                triggerOnly,
                notifyOnly
            )
        )
        let plainEach = Double(plain) / Double(inserts) / 1000
        let recordedEach = Double(recorded) / Double(inserts) / 1000
        Output.line(
            String(
                format: "  cost of history: %d single-row insert transactions, plain GRDB %.1f µs each, "
                    + "through the store (history + notification) %.1f µs each: %.2fx",
                inserts,
                plainEach,
                recordedEach,
                recordedEach / plainEach
            )
        )
    }

    /// A purge's cost while a registered consumer that is away holds `keptTransactions` of the last day: it deletes
    /// nothing, so what it costs is finding what it could delete. Against the query purges used before, in the same
    /// run: `MAX(id)` of the commits stamped before the grace and before the maximum age.
    private func measurePurge(path: String) throws {
        let store = try SharedStore(
            path: path,
            migrator: Self.migrator,
            configuration: Self.configuration(author: "bench")
        )
        let now = Date().timeIntervalSince1970
        try store.databasePool.write { db in
            let change = try db.cachedStatement(
                sql: "INSERT INTO wormhole_history(operation, table_name, primary_key) VALUES ('insert', 'item', ?)"
            )
            let commit = try db.cachedStatement(
                sql: "INSERT INTO wormhole_history(operation, author, timestamp) VALUES ('commit', 'bench', ?)"
            )
            for index in 0..<keptTransactions {
                try change.execute(arguments: ["{\"id\":\(index)}"])
                try commit.execute(arguments: [now - 86_400 + 86_400 * Double(index) / Double(keptTransactions)])
            }
            try db.execute(
                sql: "INSERT INTO wormhole_consumer(name, token, seen_at) VALUES ('away', 0, ?)",
                arguments: [now]
            )
        }
        let rounds = 20
        var purge: [UInt64] = []
        var scan: [UInt64] = []
        for _ in 0..<rounds {
            var start = monotonicNanoseconds()
            let purged = try store.purgeHistory()
            purge.append(monotonicNanoseconds() - start)
            guard purged == 0 else { throw Output.fail("the purge deleted \(purged) transactions it must keep") }
            start = monotonicNanoseconds()
            try store.databasePool.read { db in
                for cutoff in [Date().timeIntervalSince1970 - 30, Date().timeIntervalSince1970 - 7 * 86_400] {
                    _ = try Int64.fetchOne(
                        db,
                        sql: "SELECT MAX(id) FROM wormhole_history WHERE operation = 'commit' AND timestamp < ?",
                        arguments: [cutoff]
                    )
                }
            }
            scan.append(monotonicNanoseconds() - start)
        }
        let purgeMedian = Double(purge.sorted()[rounds / 2]) / 1000
        let scanMedian = Double(scan.sorted()[rounds / 2]) / 1000
        Output.line(
            String(
                format: "  purge with %d transactions kept for a consumer that is away, median of %d: %.1f µs; "
                    + "the scan of commit times it replaced, %.1f µs: %.4fx",
                keptTransactions,
                rounds,
                purgeMedian,
                scanMedian,
                purgeMedian / scanMedian
            )
        )
    }

    private func measureConcurrentWriters(path: String) throws {
        _ = try SharedStore(path: path, migrator: Self.migrator, configuration: Self.configuration(author: "bench"))
        let total = 4 * perWriter
        let watched = (0..<2).map { _ in SeenTransactions() }
        // The watchers are `wormhole store watch`: the tool, built next to this harness.
        let tool = URL(fileURLWithPath: ChildProcess.executablePath).deletingLastPathComponent()
            .appendingPathComponent("wormhole").path
        guard FileManager.default.isExecutableFile(atPath: tool) else {
            throw Output.fail(
                "the durable consumers run the wormhole tool, missing at \(tool): build it first "
                    + "(swift build -c release --product wormhole)"
            )
        }
        var watchers: [ChildProcess] = []
        for (index, ids) in watched.enumerated() {
            let watcher = try ChildProcess(
                executable: tool,
                arguments: [
                    "store", "watch", path, "--consumer", "watcher\(index)", "--count", String(total), "--timeout",
                    "300",
                ]
            ) { line in
                if let transaction = try? JSONDecoder.iso8601Decoder.decode(
                    StoreTransaction.self,
                    from: Data(line.utf8)
                ) {
                    ids.append(transaction.id)
                }
            }
            watchers.append(watcher)
        }
        Thread.sleep(forTimeInterval: 0.5)  // let the watchers register
        let start = monotonicNanoseconds()
        let writers = try (0..<4).map { index in
            try ChildProcess(
                arguments: [
                    "exercise-store", "write", "--path", path, "--count", String(perWriter), "--tag", "writer\(index)",
                ]
            ) { line in Output.line("writer: " + line) }
        }
        let failedWriters = writers.map { $0.wait(timeout: 300) }.filter { $0 != 0 }.count
        let seconds = Double(monotonicNanoseconds() - start) / 1e9
        let watcherStatuses = watchers.map { $0.wait(timeout: 300) }
        let store = try SharedStore(path: path, configuration: Self.configuration(author: "bench"))
        let rows = try store.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? 0 }
        let seen = watched.map(\.ids)
        let duplicates = seen.map { $0.count - Set($0).count }.reduce(0, +)
        let missing = seen.map { total - Set($0).count }.reduce(0, +)
        Output.line(
            String(
                format: "  4 writer processes × %d transactions in %.2f s (%.0f transactions/s): %d of %d rows, "
                    + "%d writers failed (SQLITE_BUSY or other); 2 durable consumers missed %d and saw %d twice "
                    + "(watchers exited %@)",
                perWriter,
                seconds,
                Double(total) / seconds,
                rows,
                total,
                failedWriters,
                missing,
                duplicates,
                watcherStatuses.map(String.init).joined(separator: ",")
            )
        )
    }
}

/// The transaction ids a watcher printed.
final class SeenTransactions: Sendable {
    private let storage = Locked<[Int64]>([])
    func append(_ id: Int64) { storage.withLock { $0.append(id) } }
    var ids: [Int64] { storage.withLock { $0 } }
}

/// The store benchmark's peer: answers each ping with a pong; hidden from help.
struct BenchPeerStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-peer-store",
        abstract: "Answer the store benchmark's pings.",
        shouldDisplay: false
    )

    @Option var path: String

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(0)
        #endif
        let store = try SharedStore(
            path: path,
            migrator: BenchStore.migrator,
            configuration: BenchStore.configuration(author: "peer")
        )
        let observer = try store.observeRemoteChanges(consumer: nil, tables: ["ping"]) { transaction in
            let received = Int64(monotonicNanoseconds())
            guard let id = transaction.tables["ping"]?.inserted.first?.integerValue else { return }
            try store.write { db in
                try db.execute(sql: "INSERT INTO pong(id, received_at) VALUES (?, ?)", arguments: [id, received])
            }
        }
        Output.line("ready")
        waitWhileParentLives(keeping: observer)
    }
}

extension JSONDecoder {
    /// A decoder for the tool's own JSON lines (ISO 8601 dates).
    static var iso8601Decoder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
