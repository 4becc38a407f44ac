import Dispatch
import Synchronization

/// A running consumer's sign of life: its position file's modification time, moved every quarter of the queue's
/// retention (every hour at most, every second at least), with no lock kept between two marks.
///
/// A waiting consumer used to hold a shared `flock` on its position file for as long as it ran, so that reclaiming
/// never dropped it; iOS ends a suspended app that holds a file lock in a shared container (`0xdead10cc`), so the
/// consumer now proves it is alive by the time instead (``QueueCursorFile/markSeen(waitingAtMost:)``). A mark that
/// finds the file dropped (its process was stopped or suspended for most of the retention) says so through
/// ``wasDropped``, and the cursor makes the file again at its next acknowledgement.
final class QueueHeartbeat: @unchecked Sendable {
    // @unchecked: the timer is made and resumed in `init` and only cancelled after; `file` is behind its lock.
    private let timer: DispatchSourceTimer
    private let file: Locked<QueueCursorFile>
    private let dropped = Atomic<Bool>(false)

    /// Every timer of the process's consumers fires on this queue: a mark is a few non-blocking calls.
    private static let queue = DispatchQueue(label: "wormhole.queue-heartbeat")

    /// The time between two marks for a queue of this retention.
    static func interval(retention: Duration) -> Duration {
        min(max(retention / 4, .seconds(1)), .seconds(3600))
    }

    /// Starts marking `file` every ``interval(retention:)``.
    init(file: QueueCursorFile, retention: Duration) {
        self.file = Locked(file)
        let interval = Self.interval(retention: retention)
        timer = DispatchSource.makeTimerSource(queue: Self.queue)
        let nanoseconds = Int(
            clamping: interval.components.seconds * 1_000_000_000
                + interval.components.attoseconds / 1_000_000_000
        )
        // Leeway of a tenth: the marks need not be punctual, and timers that may fire together save wake-ups.
        timer.schedule(
            deadline: .now() + .nanoseconds(nanoseconds),
            repeating: .nanoseconds(nanoseconds),
            leeway: .nanoseconds(nanoseconds / 10)
        )
        timer.setEventHandler { [weak self] in self?.mark() }
        timer.resume()
    }

    deinit { timer.cancel() }

    /// Whether a mark found the file dropped since the last ``replace(with:)``.
    var wasDropped: Bool { dropped.load(ordering: .acquiring) }

    /// Marks `file` from now on, in place of the one that was dropped.
    func replace(with file: QueueCursorFile) {
        self.file.withLock { $0 = file }
        dropped.store(false, ordering: .releasing)
    }

    private func mark() {
        let file = self.file.withLock { $0 }
        // Without waiting: a reclaiming process that holds the lock at this moment is seen at the next mark.
        if (try? file.markSeen(waitingAtMost: nil)) == false { dropped.store(true, ordering: .releasing) }
    }
}
