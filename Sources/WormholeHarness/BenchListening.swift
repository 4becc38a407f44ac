import ArgumentParser
import Foundation
import WormholeCLI
import WormholeKit

#if os(Linux) || os(Android)
import CWormholeHarness
#endif

/// Where a listener of the listening-paths benchmark gets its messages: the ways a user can listen.
enum ListeningPath: String, CaseIterable, Sendable {
    /// `on: .notifierThread`: no hop, the fastest.
    case notifierThread = "notifier-thread"
    /// The default execution, `.automatic`: inline on the notifier thread while callbacks are quick.
    case automatic = "default"
    /// `on: .serialQueue`: a serial dispatch queue per listener (the default before `.automatic`).
    case serialQueue = "serial-queue"
    /// `on: .queue(q)` with a queue of the caller's.
    case givenQueue = "given-queue"
    /// `for try await` over an `AsyncSequence`, in a plain `Task`.
    case asyncSequence = "async-sequence"
    /// The same, in a `Task(executorPreference: NotifierTaskExecutor())`.
    case asyncSequenceOnNotifier = "async-sequence-notifier-executor"
}

extension ListeningPath {
    /// Every path's name, for help and errors.
    static var names: String { allCases.map(\.rawValue).joined(separator: ", ") }

    /// The callback execution of the two paths that queue consumers and suite observers are timed along: the
    /// notifier-thread callback for every other path's name, the default (`.automatic`) for `default`.
    var consumerExecution: CallbackExecution { self == .automatic ? .automatic : .notifierThread }

    /// The callback execution of a path that listens with a callback; nil for the `AsyncSequence` paths.
    var callbackExecution: CallbackExecution? {
        switch self {
        case .notifierThread: .notifierThread
        case .automatic: .automatic
        case .serialQueue: .serialQueue
        case .givenQueue: .queue(DispatchQueue(label: "bench.given"))
        case .asyncSequence, .asyncSequenceOnNotifier: nil
        }
    }

    /// The paths that listen with a callback, for help and errors.
    static var callbackNames: String {
        allCases.filter { $0.callbackExecution != nil }.map(\.rawValue).joined(separator: ", ")
    }
}

extension ListeningPath: ExpressibleByArgument {}

/// What the messages of the listening-paths benchmark are.
enum ListeningPayload: String, CaseIterable, Sendable {
    /// ~64-byte `Codable` messages, JSON-encoded and decoded.
    case codable
    /// 64 raw bytes, passed and read as `Data`.
    case raw
}

/// One side of the listening-paths ping-pong: listens to `receiving` along `path` and calls `handle` with each
/// message's sequence number, on whatever thread the path delivers it.
final class ListeningEndpoint: Sendable {
    let wormhole: Wormhole
    let payload: ListeningPayload
    private let handle: WormholeCancellable

    init(
        wormhole: Wormhole,
        receiving identifier: String,
        path: ListeningPath,
        payload: ListeningPayload,
        handler: @escaping @Sendable (Int) -> Void
    ) throws {
        self.wormhole = wormhole
        self.payload = payload
        let onError: @Sendable (WormholeError) -> Void = { Output.error("listening failed: \($0)") }
        guard let execution = path.callbackExecution else {
            handle = Self.iterate(
                wormhole: wormhole,
                identifier: identifier,
                payload: payload,
                onNotifier: path == .asyncSequenceOnNotifier,
                handler: handler
            )
            return
        }
        switch payload {
        case .codable:
            handle = try wormhole.listenForMessage(
                withIdentifier: identifier,
                as: BenchMessage.self,
                on: execution,
                errorHandler: onError
            ) { handler($0.sequence) }
        case .raw:
            handle = try wormhole.listenForEnvelopes(withIdentifier: identifier, on: execution, errorHandler: onError) {
                handler(Self.sequence(of: $0.payload))
            }
        }
    }

    /// A task that iterates the messages as a user's `for try await` loop does.
    private static func iterate(
        wormhole: Wormhole,
        identifier: String,
        payload: ListeningPayload,
        onNotifier: Bool,
        handler: @escaping @Sendable (Int) -> Void
    ) -> WormholeCancellable {
        let task: Task<Void, Never>
        switch payload {
        case .codable:
            let messages = wormhole.messages(withIdentifier: identifier, as: BenchMessage.self)
            task = Task(executorPreference: onNotifier ? NotifierTaskExecutor() : nil) {
                do {
                    for try await message in messages { handler(message.sequence) }
                } catch {
                    Output.error("listening failed: \(error)")
                }
            }
        case .raw:
            // What a user writes for raw bytes: a ListeningSequence over the envelope callback.
            let envelopes = ListeningSequence<Envelope>(bufferingPolicy: .bufferingNewest(1)) {
                (continuation) throws(WormholeError) in
                try wormhole.listenForEnvelopes(withIdentifier: identifier, on: .notifierThread) {
                    continuation.yield($0)
                }
            }
            task = Task(executorPreference: onNotifier ? NotifierTaskExecutor() : nil) {
                do {
                    for try await envelope in envelopes { handler(Self.sequence(of: envelope.payload)) }
                } catch {
                    Output.error("listening failed: \(error)")
                }
            }
        }
        return TaskCancellable(task: task)
    }

    func send(_ sequence: Int, identifier: String) throws {
        switch payload {
        case .codable: try wormhole.passMessageObject(BenchMessage(sequence: sequence), identifier: identifier)
        case .raw:
            var bytes = Data(repeating: 0x78, count: 64)
            withUnsafeBytes(of: UInt64(sequence).littleEndian) { bytes.replaceSubrange(0..<8, with: $0) }
            _ = try wormhole.passMessageData(bytes, identifier: identifier)
        }
    }

    static func sequence(of payload: Data) -> Int {
        guard payload.count >= 8 else { return -1 }
        return Int(payload.prefix(8).withUnsafeBytes { $0.loadUnaligned(as: UInt64.self).littleEndian })
    }

    func cancel() { handle.cancel() }
}

/// Cancels a task, as a listener is cancelled.
final class TaskCancellable: WormholeCancellable {
    let task: Task<Void, Never>
    init(task: Task<Void, Never>) { self.task = task }
    func cancel() { task.cancel() }
    var isCancelled: Bool { task.isCancelled }
}

extension BenchMailbox {
    /// The ways to listen, each timed with messages sent from an app thread (this process's main thread, which waits
    /// for each answer), against the notifier-thread callback of the same payload, in the same run.
    func measureListeningPaths(
        base: String,
        label: String,
        peerCPU: Int,
        paths: [ListeningPath] = ListeningPath.allCases,
        payloads: [ListeningPayload] = ListeningPayload.allCases
    ) throws -> [String] {
        var rows: [String] = []
        for payload in payloads {
            var fastest = Double.nan
            for path in paths {
                let samples = try runListeningPath(
                    directory: base + "/listening-\(path.rawValue)-\(payload.rawValue)",
                    path: path,
                    payload: payload,
                    peerCPU: peerCPU
                )
                if path == .notifierThread { fastest = samples.p50 }
                let ratio = samples.p50 / fastest
                Output.line(
                    pad(String(label.prefix(29)), 30) + pad("\(payload.rawValue), \(path.rawValue)", 34)
                        + pad(String(format: "%.1f", samples.p50), 10) + pad(String(format: "%.1f", samples.p99), 10)
                        + String(format: "%.2f of notifier-thread", ratio)
                )
                rows.append(
                    String(
                        format: "listening %@ %@: p50 %.1f µs, %.2fx the notifier-thread callback",
                        payload.rawValue,
                        path.rawValue,
                        samples.p50,
                        ratio
                    )
                )
            }
        }
        return rows
    }

    private func runListeningPath(
        directory: String,
        path: ListeningPath,
        payload: ListeningPayload,
        peerCPU: Int
    ) throws -> LatencySamples {
        let wormhole = try Wormhole(directory: directory)
        let peer = try ChildProcess(
            arguments: [
                "bench-peer", "listening-echo", "--directory", directory, "--cpu", String(peerCPU), "--path",
                path.rawValue, "--payload", payload.rawValue,
            ],
            readyLine: "ready"
        ) { line in Output.line("peer: " + line) }
        defer { peer.terminate() }
        guard peer.waitUntilReady(timeout: 10) else { throw Output.fail("the listening peer did not start") }
        let answered = DispatchSemaphore(value: 0)
        let expected = Locked(0)
        let endpoint = try ListeningEndpoint(wormhole: wormhole, receiving: "pong", path: path, payload: payload) {
            sequence in
            // Only the answer awaited wakes the app thread: a message reported twice is not another answer.
            let matches = expected.withLock { expected in
                guard sequence == expected else { return false }
                expected += 1
                return true
            }
            if matches { answered.signal() }
        }
        defer { endpoint.cancel() }
        // The peer's listener is registered before it says ready; this one, before the first ping below.
        var samples: [UInt64] = []
        samples.reserveCapacity(roundTrips)
        for sequence in 0..<(warmUp + roundTrips) {
            let start = monotonicNanoseconds()
            try endpoint.send(sequence, identifier: "ping")
            guard answered.wait(timeout: .now() + 10) == .success else {
                throw Output.fail("no answer to ping \(sequence) along \(path.rawValue) (\(payload.rawValue))")
            }
            if sequence >= warmUp { samples.append((monotonicNanoseconds() - start) / 2) }
        }
        return LatencySamples(samples)
    }
}

extension BenchPeer {
    /// Answers each ping along the given path, from where the path delivers it.
    func echoListening(path: ListeningPath, payload: ListeningPayload) throws -> Never {
        let wormhole = try Wormhole(directory: directory)
        let answering = Locked<ListeningEndpoint?>(nil)
        let endpoint = try ListeningEndpoint(wormhole: wormhole, receiving: "ping", path: path, payload: payload) {
            sequence in
            do {
                try answering.withLock { try $0?.send(sequence, identifier: "pong") }
            } catch {
                Output.error("\(error)")
            }
        }
        answering.withLock { $0 = endpoint }
        // An async sequence registers when it is made, so the listener is in place here for every path.
        Output.line("ready")
        waitWhileParentLives(keeping: endpoint)
    }
}
