import ArgumentParser
import Foundation
import PostgresNIO
import Synchronization
import WormholeCLI
import WormholeKit
import WormholePostgres

/// `exercise-postgres-store`: the workloads of the PostgreSQL store's tests, run on the hosts they make.
struct ExercisePostgresStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exercise-postgres-store",
        abstract: "Run a PostgreSQL store workload for the package's tests.",
        shouldDisplay: false
    )

    enum Workload: String, ExpressibleByArgument {
        /// Open the store with the test migration (tables `item` and `migration_run`), then exit.
        case open
        /// Insert --count rows into `item`, one transaction each, as author --tag; a write refused because the
        /// server is away is tried again.
        case write
        /// Print each transaction as durable consumer --tag, a JSON line each, until --count; with --crash-at K,
        /// die (SIGKILL) while merging the K-th.
        case consume
    }

    @Argument var workload: Workload
    @Option var postgres: String
    @Option var group: String
    @Option var schema = "exercise"
    @Option var count = 100
    @Option var tag = "w"
    @Option var crashAt: Int?
    @Option(help: "With write: milliseconds between two writes.") var interval = 0

    /// The store of the tests: a table `item` whose key is given by the server, and `migration_run`, which counts
    /// how many times the migration ran.
    static let migrations: [PostgresStore.Migration] = [
        .init(
            "items",
            sql: "CREATE SCHEMA IF NOT EXISTS exercise",
            "CREATE TABLE item (id bigserial PRIMARY KEY, writer text NOT NULL, value bigint NOT NULL)",
            "CREATE TABLE migration_run (id bigserial PRIMARY KEY)",
            "INSERT INTO migration_run DEFAULT VALUES"
        )
    ]

    /// Inserts one row in a transaction of its own; false when the server could not be reached.
    static func insert(_ index: Int, as tag: String, into store: PostgresStore) throws(StoreError) -> Bool {
        let value = Int64(index)
        do {
            try store.write { db in try db.query("INSERT INTO item (writer, value) VALUES (\(tag), \(value))") }
            return true
        } catch {
            guard error.code == .unavailable else { throw error }
            return false
        }
    }

    func run() throws {
        let engine = try PostgresEngine(url: postgres, group: group)
        let store = try PostgresStore(
            engine: engine,
            name: "exercise",
            schema: schema,
            migrations: Self.migrations,
            configuration: .init(author: tag)
        )
        switch workload {
        case .open:
            return
        case .write:
            for index in 0..<count {
                while !(try Self.insert(index, as: tag, into: store)) {
                    // The server restarts or the link is cut: the write did not commit (or did, and a duplicate
                    // value is what the test looks for); try again.
                    Thread.sleep(forTimeInterval: 0.2)
                }
                if interval > 0 { Thread.sleep(forTimeInterval: Double(interval) / 1000) }
            }
        case .consume:
            let seen = Locked(0)
            let done = DispatchSemaphore(value: 0)
            let observer = try store.observeRemoteChanges(
                consumer: tag,
                errorHandler: { Output.error("\($0)") }
            ) { transaction in
                let number = seen.withLock {
                    $0 += 1
                    return $0
                }
                guard number <= count else { throw CancellationError() }
                let key = transaction.tables["item"]?.inserted.first?.integerValue ?? -1
                Output.line(#"{"id":\#(transaction.id),"author":"\#(transaction.author)","key":\#(key)}"#)
                if number == crashAt { kill(getpid(), SIGKILL) }  // dies before this one is acknowledged
                if number == count { done.signal() }
            }
            FileHandle.standardError.write(Data("watching\n".utf8))
            if count == 0 {
                // Registered: gone, as a consumer that will come back.
                observer.cancel()
                return
            }
            _ = done.wait(timeout: .now() + 120)
            observer.cancel()
        }
    }
}
