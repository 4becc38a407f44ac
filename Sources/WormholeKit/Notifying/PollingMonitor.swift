import Foundation
import Synchronization

/// Polls files on one thread per process: the fallback when inotify cannot be used.
///
/// What is compared is what a change alters: a notification file's token (each post writes a fresh one), a queue
/// log's size, a mailbox file's header and slot heads. Comparing bytes tells a change from none, whatever the file
/// system's timestamp resolution. The thread runs while there are observations.
final class PollingMonitor: Sendable {
    static let shared = PollingMonitor()

    private struct Observation {
        /// Reads what a change alters: a notification file's token, a queue's size, a mailbox's slot heads.
        var probe: @Sendable () -> [UInt8]?
        var interval: Duration
        var lastToken: [UInt8]?
        var nextPoll: ContinuousClock.Instant
        var handler: @Sendable () -> Void
    }
    private struct State {
        var observations: [UInt64: Observation] = [:]
        var running = false
        var nextID: UInt64 = 1
    }
    private let state = Locked(State())

    /// The 8 bytes a post writes.
    static func token(_ value: UInt64) -> [UInt8] { withUnsafeBytes(of: value.littleEndian) { Array($0) } }

    /// Bytes that differ from every earlier token: a probe gives them when it cannot tell, so that the observer is
    /// woken and reads for itself.
    static func freshToken() -> [UInt8] { token(UInt64.random(in: 0...UInt64.max)) }

    static func readToken(_ directory: DirectoryHandle, _ name: String) -> [UInt8]? {
        guard let file = try? directory.openFile(named: name, flags: O_RDONLY) else { return nil }
        return try? file.descriptor.read(count: 8, at: 0).get()
    }

    func observe(
        _ directory: DirectoryHandle,
        name: String,
        interval: Duration,
        handler: @escaping @Sendable () -> Void
    ) -> NotifierObservation {
        observe(probe: { Self.readToken(directory, name) }, interval: interval, handler: handler)
    }

    /// Calls `handler` whenever what `probe` reads differs from the previous poll.
    func observe(
        probe: @escaping @Sendable () -> [UInt8]?,
        interval: Duration,
        handler: @escaping @Sendable () -> Void
    ) -> NotifierObservation {
        let initial = probe()
        let (id, start) = state.withLock { state in
            let id = state.nextID
            state.nextID += 1
            state.observations[id] = Observation(
                probe: probe,
                interval: interval,
                lastToken: initial,
                nextPoll: .now + interval,
                handler: handler
            )
            defer { state.running = true }
            return (id, !state.running)
        }
        if start {
            Thread { [self] in
                nameCurrentThread("wh-polling")
                run()
            }.start()
        }
        return NotifierObservation { [self] in state.withLock { _ = $0.observations.removeValue(forKey: id) } }
    }

    private func run() {
        while true {
            let due: [(UInt64, Observation)] = state.withLock { state in
                state.observations.filter { $0.value.nextPoll <= .now }.map { ($0.key, $0.value) }
            }
            for (id, observation) in due {
                let token = observation.probe()
                let changed = state.withLock { state -> Bool in
                    guard state.observations[id] != nil else { return false }
                    state.observations[id]!.nextPoll = .now + observation.interval
                    defer { state.observations[id]!.lastToken = token }
                    return token != observation.lastToken
                }
                if changed { observation.handler() }
            }
            let wait: Duration? = state.withLock { state in
                guard let next = state.observations.values.map(\.nextPoll).min() else {
                    state.running = false
                    return nil
                }
                return max(.zero, next - .now)
            }
            guard let wait else { return }
            let (seconds, attoseconds) = wait.components
            Thread.sleep(forTimeInterval: Double(seconds) + Double(attoseconds) / 1e18)
        }
    }
}
