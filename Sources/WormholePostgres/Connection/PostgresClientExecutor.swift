import Dispatch

/// A task executor for a `PostgresClient`'s `run()`, so that the client opens its connections on a dispatch queue of
/// its own, never needing a thread of Swift's cooperative pool.
///
/// A ``PostgresEngine`` made with ``PostgresEngine/init(client:group:setsUpSchema:timeout:logger:)`` borrows its
/// connections from the client, and its calls are synchronous: each blocks its thread until the client lends a
/// connection. When the client has none idle, it opens one in a task of its `run()`. Run on the cooperative pool,
/// that task waits for a thread of the pool, and when calls made from `async` code block every one of them, nothing
/// opens the connection until the calls time out. Run the client on this executor and it never waits for the pool:
///
/// ```swift
/// tasks.addTask(executorPreference: PostgresClientExecutor.shared) { await client.run() }
/// ```
///
/// The executor runs one job at a time, on a serial dispatch queue; a client's jobs are short (opening, closing and
/// lending connections, keep-alives), and the statements themselves run on SwiftNIO's event loops.
public final class PostgresClientExecutor: TaskExecutor {
    /// One executor for every client of the process.
    public static let shared = PostgresClientExecutor()

    private let queue = DispatchQueue(label: "wormhole.postgres.client")

    /// A new executor, with a dispatch queue of its own.
    public init() {}

    /// Runs `job` on the executor's queue.
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { [self] in job.runSynchronously(on: asUnownedTaskExecutor()) }
    }
}
