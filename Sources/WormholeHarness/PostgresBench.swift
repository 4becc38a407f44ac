import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import WormholeCLI
import WormholeKit
import WormholePostgres

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// `pg-server`: a PostgreSQL server of its own for `Benchmarks/compare`, which every PostgreSQL case of one run
/// shares. Hidden from help.
///
/// It prints `url URL`, `directory DIR`, `pid PID` and `settings …`, then `ready`; with `--hold` it stays up until
/// its standard input closes (or SIGINT, SIGTERM, SIGHUP), then stops the server and removes its directory.
struct PostgresServerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pg-server",
        abstract: "Start a PostgreSQL server of its own for Benchmarks/compare.",
        shouldDisplay: false
    )

    @Flag(help: "Stay up until standard input closes, then stop the server and remove its directory.")
    var hold = false

    @Flag(help: "Trade durability for speed (fsync and synchronous_commit off); durable by default.")
    var fast = false

    func run() throws {
        let server: LocalPostgresServer
        do {
            server = try LocalPostgresServer(durable: !fast)
        } catch let error as LocalPostgresServerError {
            throw Output.fail("no PostgreSQL server: \(error.message)")
        }
        // A signal stops the server too, so that an interrupted run leaves none behind.
        var sources: [any DispatchSourceSignal] = []
        for number in [SIGINT, SIGTERM, SIGHUP] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                server.close()
                Foundation.exit(128 + number)
            }
            source.resume()
            sources.append(source)
        }
        let settings = try server.psql(
            "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' "
                + "|| current_setting('synchronous_commit') || ' PostgreSQL ' || current_setting('server_version')"
        )
        Output.line("url \(server.url)")
        Output.line("directory \(server.directory)")
        Output.line("pid \(server.processIdentifier)")
        Output.line("settings \(settings)")
        Output.line("ready")
        if hold {
            var buffer = [UInt8](repeating: 0, count: 256)
            while true {
                let count = read(0, &buffer, buffer.count)
                if count == 0 || (count < 0 && errno != EINTR) { break }
            }
        }
        withExtendedLifetime(sources) { server.close() }
    }
}

/// The PostgreSQL cases of `Benchmarks/compare`: one case, one metric, one JSON line on standard output, in the same
/// shape as `bench-case` prints. Hidden from help.
///
/// Every case runs between this process and a peer process (`pg-case-peer`), against one server: the wormhole's
/// mailbox, live messages and queue on its PostgreSQL engine, and what they are measured against, written by hand
/// with postgres-nio (`notify`: LISTEN and `pg_notify`; `skip-locked`: an INSERT + NOTIFY queue that a consumer
/// empties with `DELETE … FOR UPDATE SKIP LOCKED`, pgmq's design) or a Redis client of a few lines (`redis-stream`:
/// XADD, XREADGROUP and XACK). Messages are raw bytes whose first 8 carry the sequence number.
struct PostgresBenchCase: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pg-case",
        abstract: "Measure one PostgreSQL case for Benchmarks/compare.",
        shouldDisplay: false
    )

    enum Kind: String, ExpressibleByArgument, Sendable {
        case wormholeMailbox = "wormhole-mailbox"
        case wormholeLive = "wormhole-live"
        case wormholeQueue = "wormhole-queue"
        case notify
        case skipLocked = "skip-locked"
        case redisStream = "redis-stream"
    }

    @Argument var kind: Kind
    @Argument var metric: BenchCase.Metric
    @Option(help: "The server's URL (for every case but redis-stream).") var postgres: String?
    @Option(help: "The Redis server's port on 127.0.0.1 (redis-stream).") var redisPort = 6379
    @Option var size = 64
    @Option var count = 1_000
    @Option var warmUp = 100
    @Option(help: "Messages per send and per receive, for the queues (wormhole-queue, skip-locked, redis-stream).")
    var batch = 1
    @Option var cpu = 0
    @Option var peerCPU = 0
    @Option(help: "Where the wormhole's callbacks run, on both sides: \(ListeningPath.callbackNames).")
    var execution = ListeningPath.notifierThread
    @Flag(help: "The wormhole's engines borrow their connections from a PostgresClient (PostgresEngine(client:)).")
    var borrowing = false

    func validate() throws {
        if size < 8 { throw ValidationError("--size must be at least 8 bytes (the sequence number).") }
        if count < 2 || warmUp < 0 { throw ValidationError("--count must be at least 2 and --warm-up ≥ 0.") }
        if batch < 1 { throw ValidationError("--batch must be at least 1.") }
        if batch > 1 && ![.wormholeQueue, .skipLocked, .redisStream].contains(kind) {
            throw ValidationError("--batch applies to the queues only.")
        }
        if batch > 1 && metric == .latency { throw ValidationError("a latency case sends one message at a time.") }
        if kind != .redisStream && postgres == nil { throw ValidationError("--postgres URL is required.") }
        if borrowing && ![.wormholeMailbox, .wormholeLive, .wormholeQueue].contains(kind) {
            throw ValidationError("--borrowing applies to the wormhole's cases only.")
        }
        try BenchCase.validate(execution)
    }

    func run() throws {
        #if os(Linux) || os(Android)
        guard cwormhole_pin_to_cpu(Int32(cpu)) == 0 else { throw Output.fail("could not pin to CPU \(cpu)") }
        #endif
        // Names this run's group, tables, channels and streams, which the peer is told.
        let tag = "p\(getpid())"
        let names = metric == .latency ? ["ping", "pong"] : ["throughput"]
        let endpoint = try PostgresBenchEndpoints.make(
            kind,
            postgres: postgres,
            redisPort: redisPort,
            tag: tag,
            batch: batch,
            execution: execution.callbackExecution!,
            borrowing: borrowing,
            preparing: names
        )
        let name =
            "pg-\(kind.rawValue)" + (borrowing ? "-client" : "") + (batch > 1 ? "-batch" : "")
            + (execution == .notifierThread ? "" : "-\(execution.rawValue)")
        switch metric {
        case .latency:
            let samples = try measureLatency(endpoint, tag: tag)
            endpoint.close(removing: names)
            Output.line(BenchCaseReport.latency(name: name, size: size, samples: samples))
        case .throughput:
            let (received, rate) = try measureThroughput(endpoint, tag: tag)
            endpoint.close(removing: names)
            Output.line(
                BenchCaseReport.throughput(name: name, size: size, count: count, received: received, rate: rate)
            )
        }
    }

    private func startPeer(_ role: BenchCasePeer.Role, tag: String) throws -> ChildProcess {
        var arguments = [
            "pg-case-peer", kind.rawValue, role.rawValue, "--tag", tag, "--redis-port", String(redisPort),
            "--cpu", String(peerCPU), "--size", String(size), "--count", String(count), "--batch", String(batch),
            "--execution", execution.rawValue,
        ]
        if let postgres { arguments += ["--postgres", postgres] }
        if borrowing { arguments.append("--borrowing") }
        let peer = try ChildProcess(arguments: arguments, readyLine: "ready") { line in Output.error("peer: " + line) }
        guard peer.waitUntilReady(timeout: 60) else { throw Output.fail("the \(kind.rawValue) peer did not start") }
        return peer
    }

    // MARK: Latency: ping-pong, driven from the receiving callback, one-way = half the round trip

    private func measureLatency(_ endpoint: any PostgresBenchEndpoint, tag: String) throws -> [UInt64] {
        let total = warmUp + count
        let counted = warmUp
        let size = self.size
        let state = Locked<(sentAt: UInt64, samples: [UInt64], failure: String?)>((0, [], nil))
        let done = DispatchSemaphore(value: 0)
        try endpoint.receive("pong") { payloads in
            for payload in payloads {
                let now = monotonicNanoseconds()
                let sequence = BenchCaseSender.sequence(of: payload)
                let next = state.withLock { state -> Int in
                    if sequence >= counted { state.samples.append((now - state.sentAt) / 2) }
                    state.sentAt = monotonicNanoseconds()
                    return sequence + 1
                }
                guard next < total else {
                    done.signal()
                    return
                }
                do {
                    try endpoint.send([BenchCaseSender.payload(sequence: next, size: size)], to: "ping")
                } catch {
                    state.withLock { $0.failure = "\(error)" }
                    done.signal()
                }
            }
        }
        let peer = try startPeer(.echo, tag: tag)
        defer { peer.terminate() }
        state.withLock { $0.sentAt = monotonicNanoseconds() }
        try endpoint.send([BenchCaseSender.payload(sequence: 0, size: size)], to: "ping")
        guard done.wait(timeout: .now() + 600) == .success else {
            throw Output.fail("the \(kind.rawValue) ping-pong stalled")
        }
        if let failure = state.withLock({ $0.failure }) { throw Output.fail(failure) }
        return state.withLock { $0.samples }
    }

    // MARK: Throughput: one producer process, this process consumes; first to last message received

    private func measureThroughput(_ endpoint: any PostgresBenchEndpoint, tag: String) throws -> (Int, Double) {
        struct Progress {
            var first: (time: UInt64, sequence: Int)?
            var last: (time: UInt64, sequence: Int) = (0, 0)
            var received = 0
        }
        let progress = Locked(Progress())
        let done = DispatchSemaphore(value: 0)
        let final = count - 1
        try endpoint.receive("throughput") { payloads in
            let now = monotonicNanoseconds()
            let finished = progress.withLock { progress -> Bool in
                var finished = false
                for payload in payloads {
                    let sequence = BenchCaseSender.sequence(of: payload)
                    if progress.first == nil { progress.first = (now, sequence) }
                    progress.last = (now, sequence)
                    progress.received += 1
                    if sequence == final { finished = true }
                }
                return finished
            }
            if finished { done.signal() }
        }
        let peer = try startPeer(.produce, tag: tag)
        defer { peer.terminate() }
        guard done.wait(timeout: .now() + 1_200) == .success else {
            throw Output.fail("the \(kind.rawValue) throughput run stalled")
        }
        let result = progress.withLock { $0 }
        guard let first = result.first, result.last.time > first.time else {
            throw Output.fail("too few messages to time")
        }
        // As bench-case counts: from the sequence numbers, so that a mailbox's coalesced passes count as passed.
        let messages = Double(result.last.sequence - first.sequence)
        return (result.received, messages / (Double(result.last.time - first.time) / 1e9))
    }
}

/// The peer process of ``PostgresBenchCase``: echoes pings, or produces messages as fast as it can. Hidden from help.
struct PostgresBenchCasePeer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pg-case-peer",
        abstract: "The peer of pg-case.",
        shouldDisplay: false
    )

    @Argument var kind: PostgresBenchCase.Kind
    @Argument var role: BenchCasePeer.Role
    @Option var postgres: String?
    @Option var redisPort = 6379
    @Option var tag: String
    @Option var cpu = 0
    @Option var size = 64
    @Option var count = 0
    @Option var batch = 1
    @Option var execution = ListeningPath.notifierThread
    @Flag var borrowing = false

    func validate() throws { try BenchCase.validate(execution) }

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(Int32(cpu))
        #endif
        let endpoint = try PostgresBenchEndpoints.make(
            kind,
            postgres: postgres,
            redisPort: redisPort,
            tag: tag,
            batch: batch,
            execution: execution.callbackExecution!,
            borrowing: borrowing,
            preparing: []
        )
        switch role {
        case .echo:
            try endpoint.receive("ping") { payloads in
                do { try endpoint.send(payloads, to: "pong") } catch { Output.error("\(error)") }
            }
            Output.line("ready")
            // Answer until the benchmark ends this process.
            waitWhileParentLives(keeping: endpoint)
        case .produce:
            Output.line("ready")
            // The buffers are made once and their sequence numbers written in place, as bench-case's producer does.
            var messages = (0..<batch).map { BenchCaseSender.payload(sequence: $0, size: size) }
            for start in stride(from: 0, to: count, by: batch) {
                let end = min(count, start + batch)
                for index in 0..<(end - start) { BenchCaseSender.setSequence(start + index, in: &messages[index]) }
                try endpoint.send(
                    end - start == batch ? messages : Array(messages[0..<(end - start)]),
                    to: "throughput"
                )
            }
            endpoint.close(removing: [])
        }
    }
}

// MARK: - The endpoints: one per case, each a process's way to send and receive

/// One process's side of a case: it sends to and receives from named places (a mailbox, a channel, a table, a
/// stream: `ping`, `pong`, `throughput`).
protocol PostgresBenchEndpoint: AnyObject, Sendable {
    /// Hands the messages that arrive at `name` to `handler`, in order, a batch at a time, on a thread where it may
    /// block; a queue acknowledges a batch when `handler` returns. Returns once receiving.
    func receive(_ name: String, handler: @escaping @Sendable ([Data]) -> Void) throws

    /// Sends the messages to `name`, in one call of the transport for a queue (one statement, one pipeline of
    /// commands), one call each otherwise.
    func send(_ payloads: [Data], to name: String) throws

    /// Stops receiving, removes what the measuring side made for `names` (nothing for the peer), and disconnects.
    func close(removing names: [String])
}

enum PostgresBenchEndpoints {
    /// The endpoint of `kind`; `preparing` names what the measuring side makes before its peer starts.
    static func make(
        _ kind: PostgresBenchCase.Kind,
        postgres: String?,
        redisPort: Int,
        tag: String,
        batch: Int,
        execution: CallbackExecution = .notifierThread,
        borrowing: Bool = false,
        preparing names: [String]
    ) throws -> any PostgresBenchEndpoint {
        switch kind {
        case .wormholeMailbox, .wormholeLive, .wormholeQueue:
            return try WormholeBenchEndpoint(
                kind: kind,
                url: postgres ?? "",
                tag: tag,
                batch: batch,
                execution: execution,
                borrowing: borrowing
            )
        case .notify:
            return try NotifyBenchEndpoint(url: postgres ?? "", tag: tag)
        case .skipLocked:
            return try SkipLockedBenchEndpoint(url: postgres ?? "", tag: tag, batch: batch, preparing: names)
        case .redisStream:
            return try RedisStreamBenchEndpoint(port: redisPort, tag: tag, batch: batch, preparing: names)
        }
    }
}

/// The wormhole on its PostgreSQL engine, as a user writes it: `Wormhole(engine: PostgresEngine(url:group:))`.
final class WormholeBenchEndpoint: PostgresBenchEndpoint, @unchecked Sendable {
    let kind: PostgresBenchCase.Kind
    let batch: Int
    /// Where the receiving callbacks run.
    let execution: CallbackExecution
    let engine: PostgresEngine
    let wormhole: Wormhole
    private let receivers = Locked<[() -> Void]>([])
    private let queues = Locked<[String: WormholeQueue]>([:])

    /// The client the engine borrows from, when it borrows, and the task that runs it.
    private let client: (client: PostgresClient, running: Task<Void, Never>)?

    init(
        kind: PostgresBenchCase.Kind,
        url: String,
        tag: String,
        batch: Int,
        execution: CallbackExecution,
        borrowing: Bool
    ) throws {
        self.kind = kind
        self.batch = batch
        self.execution = execution
        if borrowing {
            let client = PostgresClient(
                configuration: try PostgresLocation(url: url).plainClientConfiguration(),
                backgroundLogger: Logger(label: "bench.client")
            )
            // As the engine's documentation says to run it.
            let running = Task(executorPreference: PostgresClientExecutor.shared) { await client.run() }
            self.client = (client, running)
            // This thread is the process's main thread, not one of the cooperative pool: it may wait.
            let opened = Locked<Result<PostgresEngine, WormholeError>?>(nil)
            let done = DispatchSemaphore(value: 0)
            Task {
                do throws(WormholeError) {
                    let engine = try await PostgresEngine(client: client, group: "bench.\(tag)")
                    opened.withLock { $0 = .success(engine) }
                } catch {
                    opened.withLock { $0 = .failure(error) }
                }
                done.signal()
            }
            done.wait()
            engine = try opened.withLock { $0! }.get()
        } else {
            client = nil
            engine = try PostgresEngine(url: url, group: "bench.\(tag)")
        }
        wormhole = Wormhole(engine: engine, sender: "bench-\(getpid())")
    }

    private func queue(_ name: String) throws -> WormholeQueue {
        if let queue = queues.withLock({ $0[name] }) { return queue }
        let queue = try wormhole.queue(name)
        queues.withLock { $0[name] = queue }
        return queue
    }

    func receive(_ name: String, handler: @escaping @Sendable ([Data]) -> Void) throws {
        let cancel: () -> Void
        switch kind {
        case .wormholeMailbox:
            let listener = try wormhole.listenForEnvelopes(withIdentifier: name, on: execution) {
                handler([$0.payload])
            }
            cancel = listener.cancel
        case .wormholeLive:
            let listener = try wormhole.listenForLiveMessageData(withIdentifier: name, on: execution) {
                handler([$0])
            }
            cancel = listener.cancel
        default:
            let consumer =
                batch == 1
                ? try queue(name).consumeData(consumer: "bench", on: execution) { handler([$0.value]) }
                : try queue(name).consumeDataBatches(consumer: "bench", maximumCount: batch, on: execution) {
                    handler($0.map(\.value))
                }
            cancel = consumer.cancel
        }
        receivers.withLock { $0.append(cancel) }
    }

    func send(_ payloads: [Data], to name: String) throws {
        switch kind {
        case .wormholeMailbox:
            for payload in payloads { _ = try wormhole.passMessageData(payload, identifier: name) }
        case .wormholeLive:
            for payload in payloads {
                // A live message reaches only a listener that is there; the producer waits for one rather than fail.
                try sendLive(payload, to: name)
            }
        default:
            let queue = try queue(name)
            if payloads.count == 1 {
                try queue.enqueueData(payloads[0])
            } else {
                try queue.enqueueData(contentsOf: payloads)
            }
        }
    }

    /// A live message reaches only a listener that is there; the producer waits for one rather than fail.
    private func sendLive(_ payload: Data, to name: String) throws {
        while true {
            let result = Result { () throws(WormholeError) in try wormhole.sendMessageData(payload, identifier: name) }
            switch result {
            case .success: return
            case .failure(let error) where error.code == .notReachable: usleep(1000)
            case .failure(let error): throw error
            }
        }
    }

    func close(removing names: [String]) {
        for cancel in receivers.withLock({ $0 }) { cancel() }
        engine.close()
        client?.running.cancel()
    }
}

/// A PostgreSQL connection of postgres-nio, used by blocking on its futures from threads of our own.
enum BenchConnection {
    static let logger = Logger(label: "wormhole.bench.postgres")
    private static let nextID = Locked(1)

    static func connect(_ url: String) throws -> PostgresConnection {
        let configuration = try PostgresLocation(url: url).configuration
        let id = nextID.withLock { id in
            defer { id += 1 }
            return id
        }
        return try PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.next(),
            configuration: configuration,
            id: id,
            logger: logger
        ).wait()
    }

    static func close(_ connection: PostgresConnection) {
        let closing: EventLoopFuture<Void> = connection.close()
        try? closing.wait()
    }

    @discardableResult
    static func run(_ query: PostgresQuery, on connection: PostgresConnection) throws -> [PostgresRow] {
        Array(try connection.query(query, logger: logger).wait().rows)
    }
}

/// Messages handed from a connection's event loop to a thread of ours, where a handler may block.
final class BenchInbox: @unchecked Sendable {
    private let condition = NSCondition()
    private var items: [Data] = []
    private var closed = false

    func put(_ item: Data) {
        condition.lock()
        items.append(item)
        condition.signal()
        condition.unlock()
    }

    /// Everything that came, waiting for at least one item; nil once closed.
    func take() -> [Data]? {
        condition.lock()
        defer { condition.unlock() }
        while items.isEmpty && !closed { condition.wait() }
        if closed { return nil }
        defer { items.removeAll(keepingCapacity: true) }
        return items
    }

    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }
}

/// A wake-up that coalesces: notifications that come while one is pending add nothing, as the engine's observers
/// coalesce theirs.
final class BenchWake: @unchecked Sendable {
    private let condition = NSCondition()
    private var pending = false
    private var closed = false

    func signal() {
        condition.lock()
        pending = true
        condition.signal()
        condition.unlock()
    }

    /// Waits until a wake-up is pending and takes it; false once closed.
    func wait() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        while !pending && !closed { condition.wait() }
        pending = false
        return !closed
    }

    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }
}

/// The floor of live messages: `SELECT pg_notify(channel, payload)` on one connection, `LISTEN` and postgres-nio's
/// `addListener` on another, the payload in Base64 (a notification carries text). One channel per place.
final class NotifyBenchEndpoint: PostgresBenchEndpoint, @unchecked Sendable {
    let url: String
    let tag: String
    let sender: PostgresConnection
    private let listening = Locked<[(PostgresConnection, BenchInbox)]>([])

    init(url: String, tag: String) throws {
        self.url = url
        self.tag = tag
        sender = try BenchConnection.connect(url)
    }

    private func channel(_ name: String) -> String { "bench_\(tag)_\(name)" }

    func receive(_ name: String, handler: @escaping @Sendable ([Data]) -> Void) throws {
        let connection = try BenchConnection.connect(url)
        let inbox = BenchInbox()
        connection.addListener(channel: channel(name)) { _, notification in
            inbox.put(Data(base64Encoded: notification.payload) ?? Data())
        }
        try BenchConnection.run(PostgresQuery(unsafeSQL: "LISTEN \(channel(name))"), on: connection)
        listening.withLock { $0.append((connection, inbox)) }
        let thread = Thread {
            while let items = inbox.take() { handler(items) }
        }
        thread.name = "bench.notify.\(name)"
        thread.start()
    }

    func send(_ payloads: [Data], to name: String) throws {
        for payload in payloads {
            try BenchConnection.run(
                "SELECT pg_notify(\(channel(name)), \(payload.base64EncodedString()))",
                on: sender
            )
        }
    }

    func close(removing names: [String]) {
        for (connection, inbox) in listening.withLock({ $0 }) {
            inbox.close()
            BenchConnection.close(connection)
        }
        BenchConnection.close(sender)
    }
}

/// The floor of durable queues, pgmq's design: a table with a `bigserial` id and the payload; the producer inserts
/// and notifies in one statement; the consumer, woken by `LISTEN` on its own connection, takes the oldest rows with
/// `DELETE … WHERE id = (SELECT id … ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING`, until none is left.
final class SkipLockedBenchEndpoint: PostgresBenchEndpoint, @unchecked Sendable {
    let url: String
    let tag: String
    let batch: Int
    let sender: PostgresConnection
    private let consuming = Locked<[(PostgresConnection, BenchWake)]>([])

    init(url: String, tag: String, batch: Int, preparing names: [String]) throws {
        self.url = url
        self.tag = tag
        self.batch = batch
        sender = try BenchConnection.connect(url)
        for name in names {
            try BenchConnection.run(
                PostgresQuery(
                    unsafeSQL: "CREATE TABLE \(table(name)) (id bigserial PRIMARY KEY, payload bytea NOT NULL)"
                ),
                on: sender
            )
        }
    }

    private func table(_ name: String) -> String { "bench_\(tag)_\(name)" }

    func receive(_ name: String, handler: @escaping @Sendable ([Data]) -> Void) throws {
        let table = table(name)
        let connection = try BenchConnection.connect(url)
        let wake = BenchWake()
        connection.addListener(channel: table) { _, _ in wake.signal() }
        try BenchConnection.run(PostgresQuery(unsafeSQL: "LISTEN \(table)"), on: connection)
        consuming.withLock { $0.append((connection, wake)) }
        let take =
            batch == 1
            ? PostgresQuery(
                unsafeSQL: """
                    DELETE FROM \(table) WHERE id = (SELECT id FROM \(table) ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
                    RETURNING id, payload
                    """
            )
            : PostgresQuery(
                unsafeSQL: """
                    DELETE FROM \(table) WHERE id = ANY(ARRAY(
                        SELECT id FROM \(table) ORDER BY id FOR UPDATE SKIP LOCKED LIMIT \(batch)))
                    RETURNING id, payload
                    """
            )
        let thread = Thread {
            do {
                // What was there before listening, then after each wake-up, until the table is empty.
                repeat {
                    while true {
                        var rows: [(Int64, Data)] = []
                        for row in try BenchConnection.run(take, on: connection) {
                            rows.append(try row.decode((Int64, Data).self))
                        }
                        if rows.isEmpty { break }
                        rows.sort { $0.0 < $1.0 }
                        handler(rows.map(\.1))
                    }
                } while wake.wait()
            } catch {
                if !connection.isClosed { Output.error("the SKIP LOCKED consumer of \(table) stopped: \(error)") }
            }
        }
        thread.name = "bench.skip-locked.\(name)"
        thread.start()
    }

    func send(_ payloads: [Data], to name: String) throws {
        let table = table(name)
        if payloads.count == 1 {
            try BenchConnection.run(
                """
                WITH m AS (INSERT INTO \(unescaped: table) (payload) VALUES (\(payloads[0])))
                SELECT pg_notify(\(table), '')
                """,
                on: sender
            )
        } else {
            let buffers = payloads.map { ByteBuffer(bytes: $0) }
            try BenchConnection.run(
                """
                WITH m AS (INSERT INTO \(unescaped: table) (payload) SELECT unnest(\(buffers)::bytea[]))
                SELECT pg_notify(\(table), '')
                """,
                on: sender
            )
        }
    }

    func close(removing names: [String]) {
        for (connection, wake) in consuming.withLock({ $0 }) {
            wake.close()
            BenchConnection.close(connection)
        }
        for name in names {
            _ = try? BenchConnection.run(PostgresQuery(unsafeSQL: "DROP TABLE \(table(name))"), on: sender)
        }
        BenchConnection.close(sender)
    }
}

/// Redis streams as a durable queue with a consumer group: XADD, then XREADGROUP … BLOCK and XACK once handled.
final class RedisStreamBenchEndpoint: PostgresBenchEndpoint, @unchecked Sendable {
    let port: Int
    let tag: String
    let batch: Int
    let sender: RedisConnection
    private let receiving = Locked<[RedisConnection]>([])
    private let closed = Locked(false)

    init(port: Int, tag: String, batch: Int, preparing names: [String]) throws {
        self.port = port
        self.tag = tag
        self.batch = batch
        sender = try RedisConnection(port: port)
        for name in names {
            _ = try sender.command(["DEL", key(name)])
            _ = try sender.command(["XGROUP", "CREATE", key(name), "bench", "$", "MKSTREAM"])
        }
    }

    private func key(_ name: String) -> String { "bench:\(tag):\(name)" }

    func receive(_ name: String, handler: @escaping @Sendable ([Data]) -> Void) throws {
        let key = key(name)
        let connection = try RedisConnection(port: port)
        receiving.withLock { $0.append(connection) }
        let read = ["XREADGROUP", "GROUP", "bench", "c", "COUNT", String(batch), "BLOCK", "0", "STREAMS", key, ">"]
        let closed = self.closed
        let thread = Thread {
            do {
                while true {
                    // [[key, [[id, [field, value]], …]]]
                    guard case .array(let streams?) = try connection.command(read),
                        case .array(let stream?)? = streams.first, stream.count == 2,
                        case .array(let entries?) = stream[1]
                    else { continue }
                    var ids: [String] = []
                    var payloads: [Data] = []
                    for entry in entries {
                        guard case .array(let parts?) = entry, parts.count == 2, case .bulk(let id?) = parts[0],
                            case .array(let fields?) = parts[1], fields.count == 2,
                            case .bulk(let payload?) = fields[1]
                        else { throw RedisConnection.Failure("an unexpected XREADGROUP entry: \(entry)") }
                        ids.append(String(decoding: id, as: UTF8.self))
                        payloads.append(payload)
                    }
                    handler(payloads)
                    _ = try connection.command(["XACK", key, "bench"] + ids)
                }
            } catch {
                if !closed.withLock({ $0 }) { Output.error("the Redis consumer of \(key) stopped: \(error)") }
            }
        }
        thread.name = "bench.redis.\(name)"
        thread.start()
    }

    func send(_ payloads: [Data], to name: String) throws {
        let key = Data(key(name).utf8)
        let commands = payloads.map { [Data("XADD".utf8), key, Data("*".utf8), Data("m".utf8), $0] }
        for reply in try sender.pipeline(commands) {
            guard case .bulk(.some) = reply else { throw RedisConnection.Failure("XADD answered \(reply)") }
        }
    }

    func close(removing names: [String]) {
        closed.withLock { $0 = true }
        for connection in receiving.withLock({ $0 }) { connection.close() }
        for name in names { _ = try? sender.command(["DEL", key(name)]) }
        sender.close()
    }
}

/// A Redis client of a few lines over a blocking TCP socket (RESP 2), for one thread at a time.
final class RedisConnection: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    enum Reply: CustomStringConvertible {
        case simple(String)
        case integer(Int)
        case bulk(Data?)
        case array([Reply]?)

        var description: String {
            switch self {
            case .simple(let text): text
            case .integer(let value): String(value)
            case .bulk(let data): data.map { "\($0.count) bytes" } ?? "nil"
            case .array(let items): items.map { "[\($0.map(\.description).joined(separator: ", "))]" } ?? "nil"
            }
        }
    }

    private let descriptor: Int32
    private var buffer = [UInt8](repeating: 0, count: 1 << 16)
    private var start = 0
    private var end = 0

    init(port: Int) throws {
        descriptor = socket(AF_INET, streamSocketType, 0)
        guard descriptor >= 0 else { throw Failure("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr = in_addr(s_addr: UInt32(0x7f00_0001).bigEndian)
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Foundation.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            Foundation.close(descriptor)
            throw Failure("connecting to Redis on 127.0.0.1:\(port): \(reason)")
        }
        // As hiredis does: each command goes out at once.
        var one: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { Foundation.close(descriptor) }

    /// Shuts the socket down, which ends a blocked read on another thread.
    func close() { shutdown(descriptor, Int32(SHUT_RDWR)) }

    func command(_ arguments: [String]) throws -> Reply {
        try pipeline([arguments.map { Data($0.utf8) }])[0]
    }

    /// Sends every command at once, then reads their replies.
    func pipeline(_ commands: [[Data]]) throws -> [Reply] {
        var output = Data()
        for arguments in commands {
            output.append(contentsOf: Array("*\(arguments.count)\r\n".utf8))
            for argument in arguments {
                output.append(contentsOf: Array("$\(argument.count)\r\n".utf8))
                output.append(argument)
                output.append(contentsOf: [13, 10])
            }
        }
        try output.withUnsafeBytes { bytes in
            var sent = 0
            while sent < bytes.count {
                let count = Foundation.write(descriptor, bytes.baseAddress! + sent, bytes.count - sent)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { throw Failure("writing to Redis: \(String(cString: strerror(errno)))") }
                sent += count
            }
        }
        return try commands.map { _ in try reply() }
    }

    private func reply() throws -> Reply {
        let line = try readLine()
        let rest = String(decoding: line.dropFirst(), as: UTF8.self)
        switch line.first {
        case UInt8(ascii: "+"): return .simple(rest)
        case UInt8(ascii: "-"): throw Failure("Redis: \(rest)")
        case UInt8(ascii: ":"): return .integer(Int(rest) ?? 0)
        case UInt8(ascii: "$"):
            guard let length = Int(rest), length >= 0 else { return .bulk(nil) }
            let bytes = try readExactly(length + 2)
            return .bulk(Data(bytes.prefix(length)))
        case UInt8(ascii: "*"):
            guard let count = Int(rest), count >= 0 else { return .array(nil) }
            var items: [Reply] = []
            items.reserveCapacity(count)
            for _ in 0..<count { items.append(try reply()) }
            return .array(items)
        default: throw Failure("an unexpected reply from Redis: \(rest)")
        }
    }

    private func readLine() throws -> ArraySlice<UInt8> {
        while true {
            if let newline = buffer[start..<end].firstIndex(of: 10), newline > start, buffer[newline - 1] == 13 {
                let line = buffer[start..<(newline - 1)]
                start = newline + 1
                return line
            }
            try fill()
        }
    }

    private func readExactly(_ count: Int) throws -> ArraySlice<UInt8> {
        while end - start < count { try fill(atLeast: count) }
        defer { start += count }
        return buffer[start..<(start + count)]
    }

    private func fill(atLeast wanted: Int = 0) throws {
        if start > 0 {
            buffer.replaceSubrange(0..<(end - start), with: buffer[start..<end])
            end -= start
            start = 0
        }
        if buffer.count - end < max(wanted, 4096) { buffer += [UInt8](repeating: 0, count: max(wanted, 1 << 16)) }
        let count = buffer.withUnsafeMutableBytes { Foundation.read(descriptor, $0.baseAddress! + end, $0.count - end) }
        if count < 0 && errno == EINTR { return }
        guard count > 0 else { throw Failure("Redis closed the connection") }
        end += count
    }
}
