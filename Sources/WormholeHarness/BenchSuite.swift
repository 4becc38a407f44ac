import ArgumentParser
import Foundation
import Synchronization
import WormholeCLI
import WormholeKit

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// `wormhole bench suite`: a suite's `set` against Foundation's `UserDefaults` + `synchronize()`, and how fast a
/// change reaches an observer in another process against a mailbox message, each in the same run.
struct BenchSuite: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suite",
        abstract: "Measure suites: set against UserDefaults, and a change's way to another process's observer.",
        discussion: """
            1. The cost of one set: for suites holding 10, 100 and 1,000 keys, times each `set` of one key (a small \
            string), and in the same run `UserDefaults(suiteName:)` holding as many keys, with `set(_:forKey:)` \
            and `synchronize()` (Foundation's own store, written to its file, as an app group's shared defaults \
            are). 2. Remote change latency: process A sets a key in a suite of 1,000 keys; process B's observer \
            (on the notifier thread) sets another; A's observer sets the next: one-way latency is half the round \
            trip. In the same run, the mailbox's ping-pong with ~64-byte Codable messages, the baseline. Both \
            processes on CPU 0.
            """
    )

    @Option(help: "Timed sets per suite size (after 10% warm-up).")
    var sets = 2000

    @Option(help: "Round trips for the latency figures (after the warm-up).")
    var roundTrips = 4000

    @Option(help: "Warm-up round trips, not counted.")
    var warmUp = 400

    @Option(parsing: .upToNextOption, help: "Suite sizes, in keys.")
    var sizes: [Int] = [10, 100, 1000]

    @Option(parsing: .upToNextOption, help: "Directories to measure in; 'default' is the default group root.")
    var locations: [String] = ["default", "/dev/shm"]

    func validate() throws {
        if sets < 10 || roundTrips < 100 { throw ValidationError("--sets must be ≥ 10 and --round-trips ≥ 100.") }
        if sizes.contains(where: { $0 < 1 }) { throw ValidationError("--sizes must be ≥ 1.") }
    }

    func run() throws {
        #if os(Linux) || os(Android)
        guard cwormhole_pin_to_cpu(0) == 0 else { throw Output.fail("could not pin the benchmark to CPU 0") }
        #endif
        #if DEBUG
        Output.line("warning: a debug build; build with -c release for real figures")
        #endif
        Output.line("wormhole bench suite: \(sets) sets per size, \(roundTrips) round trips, both processes on CPU 0")
        var summary: [String] = []
        // Foundation's store does not depend on the location: measured once, next to each location's sets.
        for location in locations {
            let (base, label) = try makeBenchDirectory(location, prefix: "wormhole-bench-suite")
            defer { try? FileManager.default.removeItem(atPath: base) }
            Output.line("")
            Output.line("\(label):")
            for size in sizes {
                let suite = try measureSets(directory: base + "/sets-\(size)", size: size)
                let defaults = try measureUserDefaults(size: size)
                Output.line(
                    String(
                        format: "  set among %5d keys: suite p50 %9.1f µs (p99 %9.1f), UserDefaults + synchronize "
                            + "p50 %9.1f µs (p99 %9.1f): UserDefaults / suite %.2f",
                        size,
                        suite.p50,
                        suite.p99,
                        defaults.p50,
                        defaults.p99,
                        defaults.p50 / suite.p50
                    )
                )
                summary.append(
                    String(
                        format: "%@: set among %d keys p50 %.1f µs; UserDefaults + synchronize takes %.2fx as long",
                        location,
                        size,
                        suite.p50,
                        defaults.p50 / suite.p50
                    )
                )
            }
            let mailbox = try measureMailbox(directory: base + "/mailbox")
            let remote = try measureRemoteChange(directory: base + "/remote", size: sizes.max() ?? 1000)
            let byDefault = try measureRemoteChange(
                directory: base + "/remote-default",
                size: sizes.max() ?? 1000,
                path: .automatic
            )
            Output.line(
                String(
                    format: "  remote change, one way: suite p50 %.1f µs (p99 %.1f), mailbox p50 %.1f µs (p99 %.1f): "
                        + "%.2fx the mailbox",
                    remote.p50,
                    remote.p99,
                    mailbox.p50,
                    mailbox.p99,
                    remote.p50 / mailbox.p50
                )
            )
            Output.line(
                String(
                    format: "  remote change with the default execution on both sides: p50 %.1f µs (p99 %.1f), "
                        + "%.2fx the notifier-thread observers'",
                    byDefault.p50,
                    byDefault.p99,
                    byDefault.p50 / remote.p50
                )
            )
            summary.append(
                String(
                    format: "%@: a change reaches another process's observer at p50 %.1f µs, %.2fx the mailbox",
                    location,
                    remote.p50,
                    remote.p50 / mailbox.p50
                )
            )
            summary.append(
                String(
                    format: "%@: with the default execution, %.2fx the notifier-thread observers'",
                    location,
                    byDefault.p50 / remote.p50
                )
            )
        }
        Output.line("")
        for line in summary { Output.line(line) }
    }

    // MARK: Sets

    private func measureSets(directory: String, size: Int) throws -> LatencySamples {
        let suite = try Wormhole(directory: directory).suite("bench")
        try suite.update { values in
            for index in 0..<size { try values.set("value \(index)", forKey: "key\(index)") }
        }
        let samples = try timeSets(size: size) { key, value in try suite.set(value, forKey: key) }
        guard try suite.value(forKey: "key0", as: String.self) != nil else {
            throw Output.fail("the suite lost its keys")
        }
        return samples
    }

    private func measureUserDefaults(size: Int) throws -> LatencySamples {
        let name = "wormhole-bench-\(getpid())-\(size)"
        guard let defaults = UserDefaults(suiteName: name) else { throw Output.fail("UserDefaults(suiteName:) failed") }
        defer {
            defaults.removePersistentDomain(forName: name)
            defaults.synchronize()
        }
        for index in 0..<size { defaults.set("value \(index)", forKey: "key\(index)") }
        guard defaults.synchronize() else { throw Output.fail("UserDefaults could not synchronize") }
        return try timeSets(size: size) { key, value in
            defaults.set(value, forKey: key)
            guard defaults.synchronize() else { throw Output.fail("UserDefaults could not synchronize") }
        }
    }

    /// Times `set` of one key after another, cycling through the `size` keys, after a warm-up of a tenth.
    private func timeSets(size: Int, _ set: (_ key: String, _ value: String) throws -> Void) throws -> LatencySamples {
        let warmUp = max(1, sets / 10)
        var samples: [UInt64] = []
        samples.reserveCapacity(sets)
        for index in 0..<(warmUp + sets) {
            let key = "key\(index % size)"
            let value = "value \(index) \(key)"
            let start = monotonicNanoseconds()
            try set(key, value)
            let elapsed = monotonicNanoseconds() - start
            if index >= warmUp { samples.append(elapsed) }
        }
        return LatencySamples(samples)
    }

    // MARK: Remote changes

    private func measureMailbox(directory: String) throws -> LatencySamples {
        // The mailbox benchmark's own ping-pong, with this run's counts.
        let mailbox = try BenchMailbox.parse(["--round-trips", String(roundTrips), "--warm-up", String(warmUp)])
        return try mailbox.runWormhole(directory: directory, peerCPU: 0)
    }

    /// A ping-pong of changes between observers in two processes, both with `path`'s execution.
    private func measureRemoteChange(
        directory: String,
        size: Int,
        path: ListeningPath = .notifierThread
    ) throws -> LatencySamples {
        let suite = try Wormhole(directory: directory).suite("bench")
        try suite.update { values in
            for index in 0..<size { try values.set("value \(index)", forKey: "key\(index)") }
        }
        let peer = try startPeer("suite-echo", directory: directory, path: path)
        defer { peer.terminate() }
        let pingPong = PingPong(warmUp: warmUp, roundTrips: roundTrips)
        let observer = try suite.observe(
            keys: ["pong"],
            on: path.consumerExecution,
            errorHandler: { pingPong.fail($0) }
        ) { change in
            guard let sequence = change.values["pong", as: Int.self], let next = pingPong.received(sequence) else {
                return
            }
            do throws(WormholeError) {
                try suite.set(next, forKey: "ping")
            } catch {
                pingPong.fail(error)
            }
        }
        defer { observer.cancel() }
        pingPong.start()
        try suite.set(0, forKey: "ping")
        return try pingPong.wait()
    }

    private func startPeer(
        _ mode: String,
        directory: String,
        path: ListeningPath = .notifierThread
    ) throws -> ChildProcess {
        let peer = try ChildProcess(
            arguments: ["bench-peer", mode, "--directory", directory, "--cpu", "0", "--path", path.rawValue],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        guard peer.waitUntilReady(timeout: 10) else {
            peer.terminate()
            throw Output.fail("the \(mode) peer did not start")
        }
        return peer
    }
}

/// A ping-pong driven from the receiving callback: each answer sends the next ping, so no thread hop is timed.
final class PingPong: Sendable {
    private struct State {
        var sentAt: UInt64 = 0
        var expected = 0
        var samples: [UInt64] = []
        var failure: WormholeError?
    }
    private let state = Mutex(State())
    private let done = DispatchSemaphore(value: 0)
    private let warmUp: Int
    private let total: Int

    init(warmUp: Int, roundTrips: Int) {
        self.warmUp = warmUp
        self.total = warmUp + roundTrips
    }

    func start() { state.withLock { $0.sentAt = monotonicNanoseconds() } }

    /// Records the answer to ping `sequence`; returns the next sequence to send, or nil when done (or a duplicate).
    func received(_ sequence: Int) -> Int? {
        let now = monotonicNanoseconds()
        let next: Int? = state.withLock { state in
            // A change reported twice, or an older one, is not an answer.
            guard sequence == state.expected else { return nil }
            state.expected += 1
            if sequence >= warmUp { state.samples.append((now - state.sentAt) / 2) }
            state.sentAt = monotonicNanoseconds()
            return sequence + 1
        }
        guard let next, next < total else {
            if next != nil { done.signal() }
            return nil
        }
        return next
    }

    func fail(_ error: WormholeError) {
        state.withLock { $0.failure = error }
        done.signal()
    }

    func wait() throws -> LatencySamples {
        guard done.wait(timeout: .now() + 300) == .success else { throw Output.fail("the ping-pong stalled") }
        let (samples, failure) = state.withLock { ($0.samples, $0.failure) }
        if let failure { throw failure }
        return LatencySamples(samples)
    }
}
