import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// `wormhole bench queue`: a queue between two processes against an append-only log written by hand.
struct BenchQueue: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "queue",
        abstract: "Measure durable queues between two processes, against a hand-written append-only log.",
        discussion: """
            Throughput: one producer process appends 64-byte messages as fast as it can, one consumer process \
            (this one) handles and acknowledges each; the rate is taken from the first message received to the \
            last. The floor does the same by hand: O_APPEND writes of 64 bytes, an inotify reader reading on from \
            its offset, no checksum, no position stored. Latency: ping-pong through two queues (and two logs for \
            the floor), one-way = half the round trip. Both processes on CPU 0.
            """
    )

    @Option(help: "Messages for the throughput figure.")
    var messages = 1_000_000

    @Option(help: "Round trips for the latency figure (after the warm-up).")
    var roundTrips = 10_000

    @Option(help: "Warm-up round trips, not counted.")
    var warmUp = 1_000

    @Option(parsing: .upToNextOption, help: "Directories to measure in; 'default' is the default group root.")
    var locations: [String] = ["/dev/shm", "default"]

    func run() throws {
        #if os(Linux) || os(Android)
        _ = cwormhole_pin_to_cpu(0)
        #endif
        #if DEBUG
        Output.line("warning: a debug build; run `swift run -c release wormhole bench queue` for real figures")
        #endif
        Output.line("wormhole bench queue: both processes on CPU 0, 64-byte messages")
        for location in locations {
            let (base, label) = try makeBenchDirectory(location, prefix: "wormhole-queue-bench")
            defer { try? FileManager.default.removeItem(atPath: base) }
            Output.line("")
            Output.line("\(label):")
            let floorRate = try floorThroughput(directory: base + "/floor-throughput")
            let queueRate = try queueThroughput(directory: base + "/queue-throughput")
            Output.line(
                String(
                    format:
                        "  throughput: wormhole queue %.0f messages/s, append-only log by hand %.0f messages/s (%.2fx)",
                    queueRate,
                    floorRate,
                    queueRate / floorRate
                )
            )
            let floor = try floorLatency(directory: base + "/floor-latency")
            let queue = try queueLatency(directory: base + "/queue-latency", path: .notifierThread)
            let byDefault = try queueLatency(directory: base + "/queue-latency-default", path: .automatic)
            Output.line(
                String(
                    format:
                        "  one-way latency p50/p99: wormhole queue %.1f/%.1f µs, append + inotify by hand %.1f/%.1f µs "
                        + "(p50 %.2fx)",
                    queue.p50,
                    queue.p99,
                    floor.p50,
                    floor.p99,
                    queue.p50 / floor.p50
                )
            )
            Output.line(
                String(
                    format: "  one-way latency p50/p99 with the default execution on both sides: %.1f/%.1f µs "
                        + "(p50 %.2fx the notifier-thread consumers')",
                    byDefault.p50,
                    byDefault.p99,
                    byDefault.p50 / queue.p50
                )
            )
        }
    }

    /// Consumes `count` messages from a producer process; returns messages a second.
    private func queueThroughput(directory: String) throws -> Double {
        let queue = try Wormhole(directory: directory).queue("throughput")
        let total = messages
        let times = Locked<(first: UInt64, last: UInt64, count: Int)>((0, 0, 0))
        let done = DispatchSemaphore(value: 0)
        // The clock is read at the first message and the last only, as the floor reads it once per chunk: a read per
        // message would be the benchmark's cost, not the queue's.
        let consumer = try queue.consumeData(consumer: "bench", on: .notifierThread) { _ in
            let count = times.withLock { times in
                times.count += 1
                if times.count == 1 { times.first = monotonicNanoseconds() }
                if times.count == total { times.last = monotonicNanoseconds() }
                return times.count
            }
            if count == total { done.signal() }
        }
        let producer = try ChildProcess(
            arguments: ["bench-peer", "queue-produce", "--directory", directory, "--count", String(total)]
        ) { line in Output.line("producer: " + line) }
        guard done.wait(timeout: .now() + 600) == .success else {
            throw Output.fail("the queue throughput run stalled")
        }
        consumer.cancel()
        producer.wait(timeout: 10)
        let (first, last, count) = times.withLock { $0 }
        return Double(count - 1) / (Double(last - first) / 1e9)
    }

    private func floorThroughput(directory: String) throws -> Double {
        try FileManager.default.createDirectory(
            atPath: directory,
            withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700]
        )
        #if os(Linux) || os(Android)
        let path = directory + "/floor.log"
        close(open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600))
        let inotify = inotify_init1(Int32(IN_CLOEXEC))
        defer { close(inotify) }
        guard inotify_add_watch(inotify, path, UInt32(IN_MODIFY)) >= 0 else { throw Output.fail("inotify failed") }
        let reader = open(path, O_RDONLY | O_CLOEXEC)
        defer { close(reader) }
        let producer = try ChildProcess(
            arguments: ["bench-peer", "append-produce", "--directory", directory, "--count", String(messages)]
        ) { line in Output.line("producer: " + line) }
        var events = [UInt8](repeating: 0, count: 4096)
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        var offset = 0
        var count = 0
        var first: UInt64 = 0
        var last: UInt64 = 0
        while count < messages {
            _ = read(inotify, &events, events.count)
            while true {
                let got = pread(reader, &chunk, chunk.count, off_t(offset))
                if got <= 0 { break }
                let whole = got / 64
                if whole == 0 { break }
                let now = monotonicNanoseconds()
                if count == 0 { first = now }
                count += whole
                last = now
                offset += whole * 64
            }
        }
        producer.wait(timeout: 10)
        return Double(count - 1) / (Double(last - first) / 1e9)
        #else
        throw Output.fail("the hand-written append-only log waits with inotify, which exists on Linux only")
        #endif
    }

    /// A ping-pong of one message between two consumers in two processes, both with `path`'s execution.
    private func queueLatency(directory: String, path: ListeningPath) throws -> LatencySamples {
        let wormhole = try Wormhole(directory: directory)
        let ping = try wormhole.queue("ping")
        let peer = try ChildProcess(
            arguments: ["bench-peer", "queue-echo", "--directory", directory, "--path", path.rawValue],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the queue peer did not start") }
        let total = warmUp + roundTrips
        let counted = warmUp
        let state = Locked<(sentAt: UInt64, samples: [UInt64])>((0, []))
        let done = DispatchSemaphore(value: 0)
        let payload = Data(repeating: 0x78, count: 64)
        let consumer = try wormhole.queue("pong").consumeData(consumer: "bench", on: path.consumerExecution) { _ in
            let now = monotonicNanoseconds()
            let sequence = state.withLock { state -> Int in
                let sequence = state.samples.count
                state.samples.append((now - state.sentAt) / 2)
                state.sentAt = monotonicNanoseconds()
                return sequence + 1
            }
            if sequence >= total {
                done.signal()
                return
            }
            try ping.enqueueData(payload)
        }
        state.withLock { $0.sentAt = monotonicNanoseconds() }
        try ping.enqueueData(payload)
        guard done.wait(timeout: .now() + 300) == .success else { throw Output.fail("the queue ping-pong stalled") }
        consumer.cancel()
        return LatencySamples(Array(state.withLock { $0.samples }.dropFirst(counted)))
    }

    private func floorLatency(directory: String) throws -> LatencySamples {
        try FileManager.default.createDirectory(
            atPath: directory,
            withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700]
        )
        let floor = try FloorEndpoint(kind: .append, directory: directory, receives: "pong", sends: "ping")
        let peer = try ChildProcess(
            arguments: ["bench-peer", "append", "--directory", directory],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the floor peer did not start") }
        var samples: [UInt64] = []
        for sequence in 0..<(warmUp + roundTrips) {
            let start = monotonicNanoseconds()
            try floor.send(UInt64(sequence))
            _ = try floor.receive()
            if sequence >= warmUp { samples.append((monotonicNanoseconds() - start) / 2) }
        }
        return LatencySamples(samples)
    }
}
