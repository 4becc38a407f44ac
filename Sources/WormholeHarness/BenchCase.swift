import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// The wormhole's cases of `Benchmarks/compare`: one mode, one metric, one JSON line on standard output, in the same
/// shape as the line `Benchmarks/peers/peers.c` prints for the other transports. Hidden from help.
///
/// Messages are raw bytes of the given size (no JSON coding), as they are for ZeroMQ, Redis and the floors; the first
/// 8 bytes carry the sequence number.
struct BenchCase: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-case",
        abstract: "Measure one wormhole case for Benchmarks/compare.",
        shouldDisplay: false
    )

    enum Mode: String, ExpressibleByArgument, Sendable {
        case mailbox, queue, live
        /// The queue with its batch calls: the producer appends 64 messages per write (as the Redis producer
        /// pipelines 64 commands), the consumer acknowledges up to 1,000 at a time (as XREAD COUNT 1000 reads).
        case queueBatch = "queue-batch"
    }
    /// Messages per batch of the queue-batch producer.
    static let producerBatch = 64
    enum Metric: String, ExpressibleByArgument, Sendable { case latency, throughput }

    @Argument var mode: Mode
    @Argument var metric: Metric
    @Option var size = 64
    @Option var count = 10_000
    @Option var warmUp = 1_000
    @Option var directory: String
    @Option var cpu = 0
    @Option var peerCPU = 0
    @Option(help: "Where the receiving callbacks run, on both sides: \(ListeningPath.callbackNames).")
    var execution = ListeningPath.notifierThread

    func validate() throws {
        if size < 8 { throw ValidationError("--size must be at least 8 bytes (the sequence number).") }
        if count < 2 || warmUp < 0 { throw ValidationError("--count must be at least 2 and --warm-up ≥ 0.") }
        try Self.validate(execution)
    }

    /// Refuses an `AsyncSequence` path: the cases listen with a callback.
    static func validate(_ execution: ListeningPath) throws {
        if execution.callbackExecution == nil {
            throw ValidationError("--execution takes \(ListeningPath.callbackNames).")
        }
    }

    func run() throws {
        #if os(Linux) || os(Android)
        guard cwormhole_pin_to_cpu(Int32(cpu)) == 0 else { throw Output.fail("could not pin to CPU \(cpu)") }
        #endif
        let wormhole = try Wormhole(directory: directory)
        let name = "wormhole-\(mode.rawValue)" + (execution == .notifierThread ? "" : "-\(execution.rawValue)")
        switch metric {
        case .latency:
            let samples = try measureLatency(wormhole)
            Output.line(BenchCaseReport.latency(name: name, size: size, samples: samples))
        case .throughput:
            let (received, rate) = try measureThroughput(wormhole)
            Output.line(
                BenchCaseReport.throughput(name: name, size: size, count: count, received: received, rate: rate)
            )
        }
    }

    private func startPeer(_ role: BenchCasePeer.Role) throws -> ChildProcess {
        let peer = try ChildProcess(
            arguments: [
                "bench-case-peer", mode.rawValue, role.rawValue, "--directory", directory, "--cpu", String(peerCPU),
                "--execution", execution.rawValue,
                "--size", String(size), "--count", String(count),
            ],
            readyLine: "ready"
        ) { line in Output.error("peer: " + line) }
        guard peer.waitUntilReady(timeout: 30) else { throw Output.fail("the \(mode.rawValue) peer did not start") }
        return peer
    }

    // MARK: Latency: ping-pong, driven from the receiving callback so that no thread hop is timed

    private func measureLatency(_ wormhole: Wormhole) throws -> [UInt64] {
        let sender = BenchCaseSender(mode: mode, wormhole: wormhole, identifier: "ping")
        let total = warmUp + count
        let counted = warmUp
        let state = Locked<(sentAt: UInt64, samples: [UInt64], failure: String?)>((0, [], nil))
        let done = DispatchSemaphore(value: 0)
        let size = self.size
        let receive: @Sendable (Data) -> Void = { payload in
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
                try sender.send(sequence: next, size: size)
            } catch {
                state.withLock { $0.failure = "\(error)" }
                done.signal()
            }
        }
        let receiver = try BenchCaseReceiver(
            mode: mode,
            wormhole: wormhole,
            identifier: "pong",
            execution: execution.callbackExecution!,
            handler: receive
        )
        let peer = try startPeer(.echo)
        defer { peer.terminate() }
        state.withLock { $0.sentAt = monotonicNanoseconds() }
        try sender.send(sequence: 0, size: size)
        guard done.wait(timeout: .now() + 300) == .success else {
            throw Output.fail("the \(mode.rawValue) ping-pong stalled")
        }
        receiver.cancel()
        if let failure = state.withLock({ $0.failure }) { throw Output.fail(failure) }
        return state.withLock { $0.samples }
    }

    // MARK: Throughput: one producer process, this process consumes; first to last message received

    private func measureThroughput(_ wormhole: Wormhole) throws -> (received: Int, rate: Double) {
        struct Progress {
            var first: (time: UInt64, sequence: Int)?
            var last: (time: UInt64, sequence: Int) = (0, 0)
            var received = 0
        }
        let progress = Locked(Progress())
        let done = DispatchSemaphore(value: 0)
        let final = count - 1
        let receiver = try BenchCaseReceiver(
            mode: mode,
            wormhole: wormhole,
            identifier: "throughput",
            execution: execution.callbackExecution!
        ) { payload in
            let sequence = BenchCaseSender.sequence(of: payload)
            // The clock is read at the first message and the last only, as the floors read it once per chunk: a
            // read per message would be the benchmark's cost, not the wormhole's.
            let finished = progress.withLock { progress -> Bool in
                if progress.first == nil { progress.first = (monotonicNanoseconds(), sequence) }
                if sequence == final { progress.last = (monotonicNanoseconds(), sequence) }
                progress.received += 1
                return sequence == final
            }
            if finished { done.signal() }
        }
        let peer = try startPeer(.produce)
        defer { peer.terminate() }
        guard done.wait(timeout: .now() + 600) == .success else {
            throw Output.fail("the \(mode.rawValue) throughput run stalled")
        }
        receiver.cancel()
        let result = progress.withLock { $0 }
        guard let first = result.first, result.last.time > first.time, result.last.sequence > first.sequence else {
            // A mailbox keeps the newest message: a short run can pass them all before its listener first reads.
            throw Output.fail(
                "too few messages to time: the listener saw \(result.received) of \(count); give a larger --count"
            )
        }
        // A mailbox keeps the newest message only: its rate counts the messages passed while the listener kept up,
        // from the sequence numbers, not the callbacks (fewer when passes coalesce).
        let messages = Double(result.last.sequence - first.sequence)
        return (result.received, messages / (Double(result.last.time - first.time) / 1e9))
    }
}

/// The peer process of ``BenchCase``: echoes pings, or produces messages as fast as it can. Hidden from help.
struct BenchCasePeer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench-case-peer",
        abstract: "The peer of bench-case.",
        shouldDisplay: false
    )

    enum Role: String, ExpressibleByArgument, Sendable { case echo, produce }

    @Argument var mode: BenchCase.Mode
    @Argument var role: Role
    @Option var directory: String
    @Option var cpu = 0
    @Option var size = 64
    @Option var count = 0
    @Option var execution = ListeningPath.notifierThread

    func validate() throws { try BenchCase.validate(execution) }

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(Int32(cpu))
        #endif
        let wormhole = try Wormhole(directory: directory)
        switch role {
        case .echo:
            let pong = BenchCaseSender(mode: mode, wormhole: wormhole, identifier: "pong")
            let receiver = try BenchCaseReceiver(
                mode: mode,
                wormhole: wormhole,
                identifier: "ping",
                execution: execution.callbackExecution!
            ) { payload in
                do { try pong.send(payload) } catch { Output.error("\(error)") }
            }
            Output.line("ready")
            // Answer until the benchmark ends this process.
            waitWhileParentLives(keeping: (wormhole, receiver))
        case .produce:
            let sender = BenchCaseSender(mode: mode, wormhole: wormhole, identifier: "throughput")
            Output.line("ready")
            // The messages' buffers are made once and their sequence numbers written in place, as the C peers
            // reuse one buffer: what is timed is the transport, not making messages.
            var batch = (0..<BenchCase.producerBatch).map { BenchCaseSender.payload(sequence: $0, size: size) }
            if mode == .queueBatch {
                let queue = try wormhole.queue("throughput")
                for start in stride(from: 0, to: count, by: BenchCase.producerBatch) {
                    let end = min(count, start + BenchCase.producerBatch)
                    for index in 0..<(end - start) { BenchCaseSender.setSequence(start + index, in: &batch[index]) }
                    try queue.enqueueData(contentsOf: batch[0..<(end - start)])
                }
            } else {
                for sequence in 0..<count {
                    BenchCaseSender.setSequence(sequence, in: &batch[0])
                    try sender.send(batch[0])
                }
            }
        }
    }
}

/// Sends raw messages in one of the wormhole's modes.
struct BenchCaseSender: Sendable {
    let mode: BenchCase.Mode
    let wormhole: Wormhole
    let identifier: String
    private let queue: WormholeQueue?

    init(mode: BenchCase.Mode, wormhole: Wormhole, identifier: String) {
        self.mode = mode
        self.wormhole = wormhole
        self.identifier = identifier
        queue = mode == .queue || mode == .queueBatch ? try? wormhole.queue(identifier) : nil
    }

    /// A message of `size` bytes whose first 8 bytes are `sequence`.
    static func payload(sequence: Int, size: Int) -> Data {
        var data = Data(repeating: 0x78, count: size)
        setSequence(sequence, in: &data)
        return data
    }

    /// Writes `sequence` into the first 8 bytes of a message.
    static func setSequence(_ sequence: Int, in payload: inout Data) {
        payload.withUnsafeMutableBytes { $0.storeBytes(of: UInt64(sequence).littleEndian, as: UInt64.self) }
    }

    static func sequence(of payload: Data) -> Int {
        payload.withUnsafeBytes { Int(UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self))) }
    }

    func send(sequence: Int, size: Int) throws {
        try send(Self.payload(sequence: sequence, size: size))
    }

    func send(_ payload: Data) throws {
        switch mode {
        case .mailbox: _ = try wormhole.passMessageData(payload, identifier: identifier)
        case .queue, .queueBatch:
            guard let queue else { throw Output.fail("could not open the queue \(identifier)") }
            try queue.enqueueData(payload)
        case .live:
            // A live message reaches only a listener that is there; the producer waits for one rather than fail.
            while true {
                switch Result(catching: { () throws(WormholeError) in
                    try wormhole.sendMessageData(payload, identifier: identifier)
                }) {
                case .success: return
                case .failure(let error) where error.code == .notReachable: usleep(1000)
                case .failure(let error): throw error
                }
            }
        }
    }
}

/// Receives raw messages in one of the wormhole's modes, on the notifier's (or the socket's) thread; stops when
/// cancelled.
struct BenchCaseReceiver {
    /// The listener or consumer: receiving stops when it is released.
    private let handle: AnyObject
    private let cancelling: () -> Void

    init(
        mode: BenchCase.Mode,
        wormhole: Wormhole,
        identifier: String,
        execution: CallbackExecution,
        handler: @escaping @Sendable (Data) -> Void
    ) throws {
        switch mode {
        case .mailbox:
            let listener = try wormhole.listenForEnvelopes(withIdentifier: identifier, on: execution) {
                handler($0.payload)
            }
            (handle, cancelling) = (listener, listener.cancel)
        case .queue:
            let consumer = try wormhole.queue(identifier).consumeData(consumer: "bench", on: execution) {
                handler($0.value)
            }
            (handle, cancelling) = (consumer, consumer.cancel)
        case .queueBatch:
            let consumer = try wormhole.queue(identifier).consumeDataBatches(consumer: "bench", on: execution) {
                for message in $0 { handler(message.value) }
            }
            (handle, cancelling) = (consumer, consumer.cancel)
        case .live:
            let listener = try wormhole.listenForLiveMessageData(
                withIdentifier: identifier,
                on: execution,
                listener: handler
            )
            (handle, cancelling) = (listener, listener.cancel)
        }
    }

    func cancel() { cancelling() }
}

/// The JSON lines of a comparison case, the same keys as `Benchmarks/peers/peers.c` prints.
enum BenchCaseReport {
    static func latency(name: String, size: Int, samples: [UInt64]) -> String {
        let sorted = samples.sorted()
        func at(_ fraction: Double) -> Double { Double(sorted[Int(Double(sorted.count - 1) * fraction)]) / 1000 }
        let percentiles = (0...100).map { String(format: "%.3f", at(Double($0) / 100)) }.joined(separator: ",")
        return String(
            format: "{\"case\":\"%@\",\"metric\":\"latency\",\"size\":%d,\"count\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                + "\"percentiles_us\":[%@]}",
            name,
            size,
            sorted.count,
            at(0.5),
            at(0.99),
            percentiles
        )
    }

    static func throughput(name: String, size: Int, count: Int, received: Int, rate: Double) -> String {
        String(
            format: "{\"case\":\"%@\",\"metric\":\"throughput\",\"size\":%d,\"count\":%d,\"received\":%d,"
                + "\"messages_per_second\":%.1f}",
            name,
            size,
            count,
            received,
            rate
        )
    }
}
