import ArgumentParser
import Foundation
import GRDB
import Synchronization
import WormholeCLI
import WormholeKit
import WormholeStore

/// Workloads that the package's tests run in child processes; hidden from help.
struct Exercise: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exercise",
        abstract: "Run a workload for the package's tests.",
        shouldDisplay: false
    )

    enum Workload: String, ExpressibleByArgument {
        /// Pass the integers 1...count to one identifier as fast as possible.
        case rapidSend = "rapid-send"
        /// Repeat count times: pass "a", pass "b", clear all (with --coordinated, one step for other readers).
        case passThenClear = "pass-then-clear"
        /// Pass count messages {"writer": tag, "index": i} to one identifier.
        case write
        /// Enqueue count messages {"writer": tag, "index": i} to the queue --identifier.
        case enqueue
        /// Consume the queue --identifier as consumer --tag: print "handled INDEX" for the first message, then die
        /// (SIGKILL) while handling the second.
        case consumeThenCrash = "consume-then-crash"
        /// Enqueue count messages {"writer": tag, "index": i} to the queue --identifier, one every --interval ms,
        /// retrying each failed enqueue every 100 ms for up to 120 s (a server restarting, a link cut); print
        /// "retried N" at the end, N the enqueues that failed at least once (each may have been stored twice).
        case enqueueThroughFaults = "enqueue-through-faults"
        /// Receive files on the channel --identifier as consumer --tag into --into, and die (SIGKILL) in the handler of
        /// the first file, after it was moved.
        case transferReceiveThenCrash = "transfer-receive-then-crash"
        /// Send the file --into on the transfer channel --identifier; print the peak resident memory ("peak-rss-kib=K").
        case transferSend = "transfer-send"
        /// Listen to the identifiers id-0 … id-(count-1); print "ready"; exit once each holds the value --tag (a number),
        /// printing "complete N SECONDS" (seconds from ready).
        case loadListen = "load-listen"
        /// Pass the rounds 0 … --tag to each of the identifiers id-0 … id-(count-1), round by round.
        case loadWrite = "load-write"
        /// Start and stop a listener count times; print the open descriptors before and after ("descriptors A B").
        case listenChurn = "listen-churn"
        /// Pass count messages to a mailbox and enqueue count to a queue, each with a listener or consumer in this
        /// process; print what arrived and the peak resident memory ("soak mailbox=N queue=N peak-rss-kib=K").
        case soak
        /// Increment the key "counter" of the suite --identifier count times, each a read-modify-write, and add the
        /// key "writer-TAG" each time too (two keys in one update).
        case suiteIncrement = "suite-increment"
    }

    @Argument var workload: Workload
    @Option var count = 1000
    /// enqueue: messages per batch (enqueue(contentsOf:)); 1 enqueues one at a time.
    @Option var batch = 1
    @Option var identifier = "counter"
    @Option var tag = "w"
    @Option var into: String?
    /// enqueue-through-faults: milliseconds between two messages.
    @Option var interval = 0
    @OptionGroup var location: LocationOptions

    func run() throws {
        let wormhole = try location.makeWormhole()
        switch workload {
        case .rapidSend:
            for number in 1...count { try wormhole.passMessageObject(number, identifier: identifier) }
        case .passThenClear:
            for round in 1...count {
                try wormhole.passMessageObject(round, identifier: "a")
                try wormhole.passMessageObject(round, identifier: "b")
                try wormhole.clearAllMessageContents()
            }
        case .write:
            for index in 0..<count {
                try wormhole.passMessageObject(["writer": tag, "index": String(index)], identifier: identifier)
            }
        case .enqueue:
            let queue = try wormhole.queue(identifier)
            if batch > 1 {
                for start in stride(from: 0, to: count, by: batch) {
                    try queue.enqueue(
                        contentsOf: (start..<min(count, start + batch)).map {
                            QueueExerciseMessage(writer: tag, index: $0)
                        }
                    )
                }
            } else {
                for index in 0..<count { try queue.enqueue(QueueExerciseMessage(writer: tag, index: index)) }
            }
        case .enqueueThroughFaults:
            let queue = try wormhole.queue(identifier)
            var retried = 0
            for index in 0..<count {
                let deadline = Date().addingTimeInterval(120)
                var failed = false
                while true {
                    do {
                        try queue.enqueue(QueueExerciseMessage(writer: tag, index: index))
                        break
                    } catch {
                        guard Date() < deadline else { throw error }
                        if !failed { FileHandle.standardError.write(Data("retrying \(index): \(error)\n".utf8)) }
                        failed = true
                        usleep(100_000)
                    }
                }
                if failed { retried += 1 }
                if interval > 0 { usleep(useconds_t(interval * 1000)) }
            }
            Output.line("retried \(retried)")
        case .transferReceiveThenCrash:
            let receiver = try wormhole.transfers(identifier).receive(consumer: tag, into: into ?? ".") { file in
                Output.line("moved \(file.path)")
                kill(getpid(), SIGKILL)
            }
            FileHandle.standardError.write(Data("receiving\n".utf8))
            Thread.sleep(forTimeInterval: 30)
            receiver.cancel()
        case .transferSend:
            try wormhole.transfers(identifier).send(file: into ?? "")
            Output.line("peak-rss-kib=\(peakResidentKiB())")
        case .loadListen:
            let target = Int(tag) ?? 0
            let latest = Locked([Int: Int]())
            let done = DispatchSemaphore(value: 0)
            let total = count
            var listeners: [MessageListener] = []
            for index in 0..<count {
                listeners.append(
                    try wormhole.listenForMessage(withIdentifier: "id-\(index)", as: Int.self, on: .notifierThread) {
                        value in
                        let complete = latest.withLock { latest in
                            latest[index] = value
                            return latest.count == total && latest.values.allSatisfy { $0 == target }
                        }
                        if complete { done.signal() }
                    }
                )
            }
            let start = monotonicNanoseconds()
            Output.line("ready")
            guard done.wait(timeout: .now() + 300) == .success else {
                let reached = latest.withLock { $0.values.filter { $0 == target }.count }
                throw Output.fail("only \(reached) of \(total) identifiers reached \(target)")
            }
            Output.line(String(format: "complete %d %.3f", total, Double(monotonicNanoseconds() - start) / 1e9))
            listeners.removeAll()
        case .loadWrite:
            let rounds = Int(tag) ?? 0
            for round in 0...rounds {
                for index in 0..<count { try wormhole.passMessageObject(round, identifier: "id-\(index)") }
            }
        case .listenChurn:
            // One listener first: the mailbox file it makes stays open in the wormhole's cache of descriptors, which
            // is not a leak. Then the count once the monitor thread, with nothing to watch, has retired.
            try wormhole.listenForMessage(withIdentifier: identifier, as: Int.self) { _ in }.cancel()
            var before = openDescriptorCount()
            var steady = 0
            for _ in 0..<500 where steady < 30 {
                usleep(10_000)
                let now = openDescriptorCount()
                steady = now == before ? steady + 1 : 0
                before = now
            }
            for _ in 0..<count {
                let listener = try wormhole.listenForMessage(withIdentifier: identifier, as: Int.self) { _ in }
                listener.cancel()
            }
            // The monitor thread closes its descriptors as it ends, just after the last listener goes: up to 10 s, for
            // a machine busy with other tests (2 s was seen to be too short under the whole suite on 2 cores).
            var after = openDescriptorCount()
            for _ in 0..<1_000 where after != before {
                usleep(10_000)
                after = openDescriptorCount()
            }
            Output.line("descriptors \(before) \(after)")
        case .soak:
            let delivered = Locked(0)
            let listener = try wormhole.listenForMessage(withIdentifier: identifier, as: Int.self, on: .notifierThread)
            { _ in
                delivered.withLock { $0 += 1 }
            }
            for index in 0..<count { try wormhole.passMessageObject(index, identifier: identifier) }
            // Coalescing may fold rapid passes; the last one always arrives.
            let last = try wormhole.message(withIdentifier: identifier, as: Int.self)
            listener.cancel()
            let queue = try wormhole.queue(identifier)
            let consumed = Locked(0)
            let done = DispatchSemaphore(value: 0)
            let total = count
            let consumer = try queue.consumeData(consumer: "soak", on: .notifierThread) { _ in
                if consumed.withLock({
                    $0 += 1
                    return $0
                }) == total {
                    done.signal()
                }
            }
            let payload = Data(repeating: 0x78, count: 64)
            for _ in 0..<count { try queue.enqueueData(payload) }
            _ = done.wait(timeout: .now() + 600)
            consumer.cancel()
            Output.line(
                "soak mailbox=\(delivered.withLock { $0 }) last=\(last ?? -1) queue=\(consumed.withLock { $0 }) "
                    + "peak-rss-kib=\(peakResidentKiB())"
            )
        case .suiteIncrement:
            let suite = try wormhole.suite(identifier)
            for _ in 0..<count {
                try suite.update(direction: tag) { (values: inout SuiteValues) throws(WormholeError) in
                    try values.set((values["counter", as: Int.self] ?? 0) + 1, forKey: "counter")
                    try values.set((values["writer-\(tag)", as: Int.self] ?? 0) + 1, forKey: "writer-\(tag)")
                }
            }
        case .consumeThenCrash:
            let seen = Locked(0)
            let consumer = try wormhole.queue(identifier).consume(consumer: tag, as: QueueExerciseMessage.self) {
                message in
                let number = seen.withLock {
                    $0 += 1
                    return $0
                }
                Output.line("handled \(message.value.index)")
                if number == 2 { kill(getpid(), SIGKILL) }  // dies before the second is acknowledged
            }
            FileHandle.standardError.write(Data("consuming\n".utf8))
            Thread.sleep(forTimeInterval: 30)
            consumer.cancel()
        }
    }
}

/// How many descriptors this process has open.
func openDescriptorCount() -> Int {
    #if os(Linux) || os(Android)
    let listing = "/proc/self/fd"
    #else
    let listing = "/dev/fd"  // fdesc(5): the calling process's descriptors
    #endif
    return (try? FileManager.default.contentsOfDirectory(atPath: listing).count) ?? -1
}

/// The process's peak resident memory (VmHWM), in KiB.
func peakResidentKiB() -> Int {
    #if os(Linux) || os(Android)
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") })
    else { return -1 }
    return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    #else
    // getrusage(2) on Darwin gives the peak in bytes (Linux's in KiB).
    var usage = rusage()
    guard getrusage(RUSAGE_SELF, &usage) == 0 else { return -1 }
    return Int(usage.ru_maxrss) / 1024
    #endif
}

/// The message of the queue workloads.
struct QueueExerciseMessage: Codable, Sendable {
    var writer: String
    var index: Int
}

/// Store workloads that the package's tests run in child processes; hidden from help.
struct ExerciseStore: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exercise-store",
        abstract: "Run a store workload for the package's tests.",
        shouldDisplay: false
    )

    enum Workload: String, ExpressibleByArgument {
        /// Open the store with the test migration (a table `item`), then exit.
        case open
        /// Insert count rows into `item`, one transaction each, as author --tag.
        case write
        /// Consume remote changes as durable consumer --tag: merge the first, then die (SIGKILL) while merging the
        /// second.
        case consumeThenCrash = "consume-then-crash"
    }

    @Argument var workload: Workload
    @Option var path: String
    @Option var count = 100
    @Option var tag = "w"

    func run() throws {
        let store = try SharedStore(
            path: path,
            migrator: StoreFixtures.itemsMigrator,
            configuration: .init(author: tag, observesRemoteChanges: false)
        )
        switch workload {
        case .open:
            return
        case .write:
            for index in 0..<count {
                try store.write { db in
                    try db.execute(sql: "INSERT INTO item(writer, value) VALUES (?, ?)", arguments: [tag, index])
                }
            }
        case .consumeThenCrash:
            let seen = Locked(0)
            let observer = try store.observeRemoteChanges(consumer: tag) { transaction in
                let number = seen.withLock {
                    $0 += 1
                    return $0
                }
                Output.line("merging \(transaction.id)")
                if number == 2 { kill(getpid(), SIGKILL) }  // dies before this one is acknowledged
            }
            FileHandle.standardError.write(Data("watching\n".utf8))
            Thread.sleep(forTimeInterval: 30)
            observer.cancel()
        }
    }
}
