import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// The message of the benchmark: a counter and padding that make about 64 bytes of JSON.
struct BenchMessage: Codable, Sendable {
    var sequence: Int
    var padding: String

    init(sequence: Int) {
        self.sequence = sequence
        self.padding = String(repeating: "x", count: 36)
    }
}

/// One-way latencies in nanoseconds, with the figures a report wants.
struct LatencySamples {
    var values: [UInt64]

    init(_ values: [UInt64]) { self.values = values.sorted() }

    func percentile(_ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        return Double(values[min(values.count - 1, Int(Double(values.count) * p))]) / 1000
    }
    var p50: Double { percentile(0.50) }
    var p99: Double { percentile(0.99) }
}

enum Placement: String, ExpressibleByArgument, CaseIterable {
    /// Both processes on CPU 0: no cross-CPU wake-up in the figures.
    case same
    /// The benchmark on CPU 0, its peer on CPU 1: each message crosses CPUs (about 25 µs more here).
    case split
}

func monotonicNanoseconds() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

/// A fresh directory (mode 0700) for one benchmark run in `location` ("default" is the default group root), and how
/// to name the location in a report. The caller removes it.
func makeBenchDirectory(_ location: String, prefix: String) throws -> (path: String, label: String) {
    let root = location == "default" ? GroupContainer.rootDirectory() + "/group.wormhole.bench" : location
    let path = root + "/\(prefix)-\(getpid())"
    try FileManager.default.createDirectory(
        atPath: path,
        withIntermediateDirectories: true,
        attributes: [.posixPermissions: 0o700]
    )
    return (path, location == "default" ? "default (\(root))" : location)
}

/// `wormhole bench`: the benchmarks; the mailbox one runs by default.
struct Bench: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure the wormhole against baselines in the same run (`bench mailbox` by default).",
        subcommands: [BenchMailbox.self, BenchQueue.self, BenchStore.self, BenchSuite.self],
        defaultSubcommand: BenchMailbox.self
    )
}

struct BenchMailbox: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mailbox",
        abstract: "Measure mailbox latency between two processes, against a hand-written floor in the same run.",
        discussion: """
            For each directory (the default group root and /dev/shm), runs ping-pong between this process and a \
            peer process: the wormhole (pass → decoded in the peer's listener → pass back), and two floors \
            written by hand with the same message size: write a temporary file, rename it, inotify wake-up, read \
            (the classic way); and an in-place write with an inotify wake-up. One-way latency is half the round \
            trip. Figures print as ratios to the floors, measured in the same run. Also measures how many \
            mailbox writes a second one process passes. Then the ways to listen, with ~64-byte Codable messages \
            and with 64 raw bytes, sent from an app thread that waits for each answer: the notifier-thread \
            callback, the default execution (`.automatic`: inline on the notifier thread while quick), a serial \
            queue per listener, a given dispatch queue and an AsyncSequence, the peer answering along the same path; \
            ratios are to the notifier-thread callback of the \
            same run. Build with -c release for meaningful figures. `wormhole bench store` measures the shared \
            SQLite store.
            """
    )

    @Option(help: "Round trips per case (after the warm-up).")
    var roundTrips = 10_000

    @Option(help: "Warm-up round trips per case, not counted.")
    var warmUp = 1_000

    @Option(help: "Mailbox writes for the throughput figure.")
    var writes = 100_000

    @Option(help: "Where the two processes run: same (both on CPU 0) or split (CPU 0 and CPU 1).")
    var placement: Placement = .same

    @Option(
        parsing: .upToNextOption,
        help: "Directories to measure in; 'default' is the default group root."
    )
    var locations: [String] = ["default", "/dev/shm"]

    @Option(
        parsing: .upToNextOption,
        help:
            "Only these ways to listen, and nothing else (for a profile of one path): \(ListeningPath.names)."
    )
    var onlyListening: [String] = []

    @Option(help: "With --only-listening: the payload, codable or raw.")
    var payload = ListeningPayload.codable.rawValue

    func validate() throws {
        if onlyListening.contains(where: { ListeningPath(rawValue: $0) == nil }) {
            throw ValidationError("--only-listening takes \(ListeningPath.names).")
        }
        if ListeningPayload(rawValue: payload) == nil { throw ValidationError("--payload is codable or raw.") }
        if roundTrips < 100 { throw ValidationError("--round-trips must be at least 100.") }
        if warmUp < 0 || writes < 1 { throw ValidationError("--warm-up must be ≥ 0 and --writes ≥ 1.") }
    }

    func run() throws {
        #if os(Linux) || os(Android)
        guard cwormhole_pin_to_cpu(0) == 0 else { throw Output.fail("could not pin the benchmark to CPU 0") }
        #endif
        let peerCPU = placement == .same ? 0 : 1
        #if DEBUG
        Output.line("warning: a debug build; run `swift run -c release wormhole bench` for real figures")
        #endif
        Output.line(
            "wormhole bench: \(roundTrips) round trips per case after \(warmUp) warm-up, ~64-byte messages, "
                + "placement \(placement.rawValue) (benchmark on CPU 0, peer on CPU \(peerCPU))"
        )
        Output.line("")
        Output.line(pad("location", 30) + pad("case", 34) + pad("p50 µs", 10) + pad("p99 µs", 10) + "p50 ratio")
        var summary: [String] = []
        for location in locations {
            let (base, label) = try makeBenchDirectory(location, prefix: "wormhole-bench")
            defer { try? FileManager.default.removeItem(atPath: base) }
            if !onlyListening.isEmpty {
                summary += try measureListeningPaths(
                    base: base,
                    label: label,
                    peerCPU: peerCPU,
                    paths: onlyListening.compactMap(ListeningPath.init(rawValue:)),
                    payloads: [ListeningPayload(rawValue: payload)!]
                ).map { location + ": " + $0 }
                continue
            }
            let renameFloor = try runFloor(.rename, directory: base + "/floor-rename", peerCPU: peerCPU)
            let inPlaceFloor = try runFloor(.inPlace, directory: base + "/floor-in-place", peerCPU: peerCPU)
            let wormhole = try runWormhole(directory: base + "/wormhole", peerCPU: peerCPU)
            let rows: [(String, LatencySamples, String)] = [
                ("floor: write, rename, inotify", renameFloor, "1.00"),
                (
                    "floor: in-place write, inotify", inPlaceFloor,
                    String(format: "%.2f", inPlaceFloor.p50 / renameFloor.p50)
                ),
                ("wormhole mailbox", wormhole, String(format: "%.2f", wormhole.p50 / renameFloor.p50)),
            ]
            for (name, samples, ratio) in rows {
                Output.line(
                    pad(String(label.prefix(29)), 30) + pad(name, 34) + pad(String(format: "%.1f", samples.p50), 10)
                        + pad(String(format: "%.1f", samples.p99), 10) + ratio
                )
            }
            summary.append(
                String(
                    format: "%@: wormhole p50 %.1f µs = %.2fx the rename floor, %.2fx the in-place floor",
                    location,
                    wormhole.p50,
                    wormhole.p50 / renameFloor.p50,
                    wormhole.p50 / inPlaceFloor.p50
                )
            )
            let rate = try measureWrites(directory: base + "/throughput")
            summary.append(String(format: "%@: %.0f mailbox writes a second from one process", location, rate))
            summary += try measureListeningPaths(base: base, label: label, peerCPU: peerCPU).map {
                location + ": " + $0
            }
            let parts = try measureParts(directory: base + "/parts")
            summary.append(
                "\(location): where a pass and a read go, in µs each: "
                    + parts.map { String(format: "%@ %.2f", $0.0, $0.1) }.joined(separator: ", ")
            )
        }
        Output.line("")
        for line in summary { Output.line(line) }
    }

    func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }

    // MARK: The wormhole

    func runWormhole(directory: String, peerCPU: Int) throws -> LatencySamples {
        let wormhole = try Wormhole(directory: directory)
        let peer = try ChildProcess(
            arguments: ["bench-peer", "wormhole", "--directory", directory, "--cpu", String(peerCPU)],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the peer did not start") }

        let pingPong = PingPong(warmUp: warmUp, roundTrips: roundTrips)
        let listener = try wormhole.listenForMessage(
            withIdentifier: "pong",
            as: BenchMessage.self,
            on: .notifierThread,
            errorHandler: { pingPong.fail($0) }
        ) { message in
            guard let next = pingPong.received(message.sequence) else { return }
            do throws(WormholeError) {
                try wormhole.passMessageObject(BenchMessage(sequence: next), identifier: "ping")
            } catch {
                pingPong.fail(error)
            }
        }
        defer { listener.cancel() }
        pingPong.start()
        try wormhole.passMessageObject(BenchMessage(sequence: 0), identifier: "ping")
        return try pingPong.wait()
    }

    // MARK: The floors

    private func runFloor(_ kind: FloorKind, directory: String, peerCPU: Int) throws -> LatencySamples {
        try FileManager.default.createDirectory(
            atPath: directory,
            withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700]
        )
        let floor = try FloorEndpoint(kind: kind, directory: directory, receives: "pong", sends: "ping")
        let peer = try ChildProcess(
            arguments: ["bench-peer", kind.rawValue, "--directory", directory, "--cpu", String(peerCPU)],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the floor peer did not start") }
        var samples: [UInt64] = []
        samples.reserveCapacity(roundTrips)
        for sequence in 0..<(warmUp + roundTrips) {
            let start = monotonicNanoseconds()
            try floor.send(UInt64(sequence))
            let answer = try floor.receive()
            let elapsed = monotonicNanoseconds() - start
            guard answer == UInt64(sequence) else {
                throw Output.fail("the floor peer answered \(answer) to \(sequence)")
            }
            if sequence >= warmUp { samples.append(elapsed / 2) }
        }
        return LatencySamples(samples)
    }

    // MARK: Where the time goes

    /// The average cost of each step of a pass and of a read, in µs, measured in this process. A pass posts nothing:
    /// the mailbox file's own write wakes its listeners.
    private func measureParts(directory: String) throws -> [(String, Double)] {
        let wormhole = try Wormhole(directory: directory)
        let message = BenchMessage(sequence: 1)
        let payload = try wormhole.coder.encode(message)
        let count = max(1000, writes / 5)
        func average(_ body: () throws -> Void) rethrows -> Double {
            for _ in 0..<100 { try body() }
            let start = monotonicNanoseconds()
            for _ in 0..<count { try body() }
            return Double(monotonicNanoseconds() - start) / Double(count) / 1000
        }
        return [
            ("encode", try average { _ = try wormhole.coder.encode(message) }),
            (
                "store",
                try average { _ = try wormhole.transiting.writeMessage(payload, sender: "bench", identifier: "parts") }
            ),
            ("read", try average { _ = try wormhole.transiting.readMessage(identifier: "parts") }),
            ("decode", try average { _ = try wormhole.coder.decode(BenchMessage.self, from: payload) }),
        ]
    }

    // MARK: Throughput

    private func measureWrites(directory: String) throws -> Double {
        let wormhole = try Wormhole(directory: directory)
        let message = BenchMessage(sequence: 0)
        for _ in 0..<1000 { try wormhole.passMessageObject(message, identifier: "throughput") }
        let start = monotonicNanoseconds()
        for sequence in 0..<writes {
            try wormhole.passMessageObject(BenchMessage(sequence: sequence), identifier: "throughput")
        }
        let seconds = Double(monotonicNanoseconds() - start) / 1e9
        guard try wormhole.message(withIdentifier: "throughput", as: BenchMessage.self)?.sequence == writes - 1 else {
            throw Output.fail("the last write of the throughput run was not read back")
        }
        return Double(writes) / seconds
    }
}

/// The benchmark's peer process; hidden from help.
struct BenchPeer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-peer",
        abstract: "Answer the benchmark's pings.",
        shouldDisplay: false
    )

    enum Mode: String, ExpressibleByArgument {
        case wormhole, rename
        case inPlace = "in-place"
        case append
        case queueProduce = "queue-produce"
        /// Consumes `--count` messages already in the queue, then exits: the consumer alone, for a profiler.
        case queueDrain = "queue-drain"
        /// `--count` round trips of raw mailbox messages between two listeners of this one process: a mailbox pass
        /// and its delivery with no child process, for a profiler (`valgrind` cannot follow the peers' spawn).
        case mailboxLoop = "mailbox-loop"
        /// The same with live messages: a send and its delivery with no child process, for a profiler.
        case liveLoop = "live-loop"
        case appendProduce = "append-produce"
        case queueEcho = "queue-echo"
        case suiteEcho = "suite-echo"
        case listeningEcho = "listening-echo"
    }

    @Argument var mode: Mode
    @Option var directory: String
    @Option var cpu = 0
    @Option var count = 0
    @Option var path = ListeningPath.notifierThread.rawValue
    @Option var payload = ListeningPayload.codable.rawValue

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(Int32(cpu))
        #endif
        switch mode {
        case .wormhole:
            let wormhole = try Wormhole(directory: directory)
            let listener = try wormhole.listenForMessage(
                withIdentifier: "ping",
                as: BenchMessage.self,
                on: .notifierThread,
                errorHandler: { Output.error("\($0)") }
            ) { message in
                do { try wormhole.passMessageObject(message, identifier: "pong") } catch { Output.error("\(error)") }
            }
            Output.line("ready")
            // Answer until the benchmark ends this process.
            while !listener.isCancelled { sleep(60) }
        case .rename, .inPlace, .append:
            let kind: FloorKind = mode == .rename ? .rename : mode == .inPlace ? .inPlace : .append
            let floor = try FloorEndpoint(kind: kind, directory: directory, receives: "ping", sends: "pong")
            Output.line("ready")
            while true { try floor.send(try floor.receive()) }
        case .queueProduce:
            let queue = try Wormhole(directory: directory).queue("throughput")
            let payload = Data(repeating: 0x78, count: 64)
            for _ in 0..<count { try queue.enqueueData(payload) }
        case .queueDrain:
            let queue = try Wormhole(directory: directory).queue("throughput")
            let handled = Atomic<Int>(0)
            let done = DispatchSemaphore(value: 0)
            let total = count
            let consumer = try queue.consumeData(consumer: "bench", on: .notifierThread) { _ in
                if handled.add(1, ordering: .relaxed).newValue == total { done.signal() }
            }
            guard done.wait(timeout: .now() + 600) == .success else { throw Output.fail("the queue drain stalled") }
            consumer.cancel()
        case .mailboxLoop:
            let wormhole = try Wormhole(directory: directory)
            try loop(
                "mailbox",
                listen: { identifier, handler in
                    let listener = try wormhole.listenForEnvelopes(withIdentifier: identifier, on: .notifierThread) {
                        handler($0.payload)
                    }
                    return listener.cancel
                },
                send: { _ = try wormhole.passMessageData($0, identifier: $1) }
            )
        case .liveLoop:
            let wormhole = try Wormhole(directory: directory)
            try loop(
                "live",
                listen: { identifier, handler in
                    let listener = try wormhole.listenForLiveMessageData(
                        withIdentifier: identifier,
                        on: .notifierThread,
                        listener: handler
                    )
                    return listener.cancel
                },
                send: { _ = try wormhole.sendMessageData($0, identifier: $1) }
            )
        case .appendProduce:
            let descriptor = open(directory + "/floor.log", O_WRONLY | O_APPEND | O_CLOEXEC)
            guard descriptor >= 0 else { throw Output.fail("could not open the floor log") }
            let record = [UInt8](repeating: 0x78, count: 64)
            for _ in 0..<count {
                guard write(descriptor, record, 64) == 64 else { throw Output.fail("floor append failed") }
            }
            close(descriptor)
        case .queueEcho:
            let wormhole = try Wormhole(directory: directory)
            let pong = try wormhole.queue("pong")
            let execution = ListeningPath(rawValue: path)?.consumerExecution ?? .notifierThread
            let consumer = try wormhole.queue("ping").consumeData(consumer: "echo", on: execution) { message in
                try pong.enqueueData(message.value)
            }
            Output.line("ready")
            waitWhileParentLives(keeping: consumer)
        case .listeningEcho:
            guard let path = ListeningPath(rawValue: path), let payload = ListeningPayload(rawValue: payload) else {
                throw Output.fail("unknown --path or --payload")
            }
            try echoListening(path: path, payload: payload)
        case .suiteEcho:
            // Answers each ping of the suite with the same number as its pong.
            let suite = try Wormhole(directory: directory).suite("bench")
            let execution = ListeningPath(rawValue: path)?.consumerExecution ?? .notifierThread
            let observer = try suite.observe(keys: ["ping"], on: execution) { change in
                guard let sequence = change.values["ping", as: Int.self] else { return }
                do { try suite.set(sequence, forKey: "pong") } catch { Output.error("\(error)") }
            }
            Output.line("ready")
            waitWhileParentLives(keeping: observer)
        }
    }

    /// `--count` round trips of raw messages between two listeners of this one process, "ping" answered on "pong"
    /// and "pong" on "ping" with the next sequence number, each on the thread that delivers it (a mailbox's
    /// inotify thread, a live listener's own): a send and its delivery with no child process, for a profiler
    /// (`valgrind` cannot follow the peers' spawn).
    private func loop(
        _ mode: String,
        listen: (String, @escaping @Sendable (Data) -> Void) throws -> (@Sendable () -> Void),
        send: @escaping @Sendable (Data, String) throws -> Void
    ) throws {
        let done = DispatchSemaphore(value: 0)
        let total = count
        let cancelEcho = try listen("ping") { payload in
            do { try send(payload, "pong") } catch { Output.error("\(error)") }
        }
        let cancelAnswer = try listen("pong") { payload in
            let sequence = BenchCaseSender.sequence(of: payload) + 1
            guard sequence < total else {
                done.signal()
                return
            }
            var next = payload
            BenchCaseSender.setSequence(sequence, in: &next)
            do { try send(next, "ping") } catch { Output.error("\(error)") }
        }
        try send(Data(repeating: 0, count: 64), "ping")
        guard done.wait(timeout: .now() + 600) == .success else { throw Output.fail("the \(mode) loop stalled") }
        cancelEcho()
        cancelAnswer()
    }
}
