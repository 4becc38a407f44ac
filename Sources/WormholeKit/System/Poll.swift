import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
#if os(Linux) || os(Android)
import CWormholeSystem
#endif

/// The descriptors a serving thread waits on with `poll(2)`, each for input, and what the last wait found.
///
/// The set is kept between waits and changed in place, so a loop that waits, reads and waits again allocates nothing
/// per wait (the storage grows only when a descriptor is added past its capacity). Hang-ups and errors count as ready:
/// `poll` always reports them, and the read that follows tells which it was.
struct PollSet {
    private var entries: [pollfd] = []

    init(capacity: Int = 0) { entries.reserveCapacity(capacity) }

    var count: Int { entries.count }

    /// Adds a descriptor to wait on for input.
    mutating func append(_ descriptor: Int32) {
        entries.append(pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0))
    }

    func descriptor(at index: Int) -> Int32 { entries[index].fd }

    /// Whether the last wait found the descriptor at `index` readable, hung up or failed.
    func isReady(at index: Int) -> Bool { entries[index].revents != 0 }

    /// Keeps, in their order, the entries from `start` on for which `keep` returns true, in place. `keep` is given each
    /// entry's descriptor and whether the last wait found it ready.
    mutating func retain(from start: Int, where keep: (_ descriptor: Int32, _ isReady: Bool) -> Bool) {
        var kept = start
        for index in start..<entries.count where keep(entries[index].fd, entries[index].revents != 0) {
            if kept != index { entries[kept] = entries[index] }
            kept += 1
        }
        entries.removeLast(entries.count - kept)
    }

    /// Waits until a descriptor is ready or `milliseconds` pass (-1: no limit), and returns how many are ready (0 on
    /// time-out). A wait a signal interrupts starts again, with the whole time-out.
    mutating func wait(milliseconds: Int32) -> Result<Int, Errno> {
        let count = nfds_t(entries.count)
        return entries.withUnsafeMutableBufferPointer { buffer in
            valueOrErrno { poll(buffer.baseAddress, count, milliseconds) }.map { Int($0) }
        }
    }

    /// Waits until one descriptor is readable (or hung up), for at most `timeout` from `start`; false on time-out.
    ///
    /// A wait a signal interrupts goes on for the time left, not the whole time-out again, so that signals that come
    /// more often than the time-out (a profiler's, a timer's) cannot make it endless; a time-out shorter than a
    /// millisecond waits one, and one too long for `poll` waits as long as it can, then goes on.
    static func waitReadable(
        _ descriptor: Int32,
        for timeout: Duration,
        from start: ContinuousClock.Instant
    ) -> Result<Bool, Errno> {
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        while true {
            let left = timeout - start.duration(to: .now)
            guard left > .zero else { return .success(false) }
            let milliseconds = Int32(min(left.milliseconds.rounded(.up), Double(Int32.max)))
            switch valueOrErrno(retryOnInterrupt: false, { poll(&entry, 1, milliseconds) }) {
            case .success(let ready) where ready > 0: return .success(true)
            case .success, .failure(.interrupted): continue  // the time left decides
            case .failure(let errno): return .failure(errno)
            }
        }
    }
}

extension PollSet {
    /// Waits until one of `descriptors` can be written to, or `milliseconds` pass; a failure of the wait (an
    /// interruption) ends it early, and the caller tries again either way.
    static func waitWritable(_ descriptors: [Int32], milliseconds: Int32) {
        var entries = descriptors.map { pollfd(fd: $0, events: Int16(POLLOUT), revents: 0) }
        _ = poll(&entries, nfds_t(entries.count), milliseconds)
    }
}

extension Duration {
    /// The duration in milliseconds, as a `Double`: no overflow, whatever its size.
    package var milliseconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) * 1000 + Double(attoseconds) / 1e15
    }
}

/// Wakes a thread that waits in `poll(2)`, to stop it: an eventfd on Linux, a pipe elsewhere.
///
/// The thread polls ``pollDescriptor`` with the rest; ``signal()``, from any thread, makes it readable until
/// ``clear()``. Both ends are close-on-exec and non-blocking, and are closed when the value goes away.
struct WakeUpSignal: ~Copyable, Sendable {
    /// The descriptor to poll for input.
    let pollDescriptor: Int32
    /// The descriptor ``signal()`` writes to: the same eventfd on Linux, the pipe's other end elsewhere.
    private let signalDescriptor: Int32

    init() throws(Errno) {
        #if os(Linux) || os(Android)
        let descriptor = cwormhole_eventfd()
        guard descriptor >= 0 else { throw currentErrno }
        pollDescriptor = descriptor
        signalDescriptor = descriptor
        #else
        var ends: (Int32, Int32) = (-1, -1)
        let created = withUnsafeMutableBytes(of: &ends) { bytes in
            valueOrErrno { pipe(bytes.baseAddress!.assumingMemoryBound(to: Int32.self)) }
        }
        if case .failure(let errno) = created { throw errno }
        for end in [ends.0, ends.1] {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
        }
        pollDescriptor = ends.0
        signalDescriptor = ends.1
        #endif
    }

    deinit {
        _ = close(pollDescriptor)
        if signalDescriptor != pollDescriptor { _ = close(signalDescriptor) }
    }

    /// Makes ``pollDescriptor`` readable. Never blocks: a wake-up already pending is enough.
    func signal() {
        #if os(Linux) || os(Android)
        var one: UInt64 = 1
        _ = valueOrErrno { write(signalDescriptor, &one, MemoryLayout<UInt64>.size) }
        #else
        var byte: UInt8 = 1
        _ = valueOrErrno { write(signalDescriptor, &byte, 1) }
        #endif
    }

    /// Takes the pending wake-ups away, so that ``pollDescriptor`` is no longer readable.
    func clear() {
        var bytes: (UInt64, UInt64) = (0, 0)
        while case .success(let count) = withUnsafeMutableBytes(
            of: &bytes,
            { buffer in
                valueOrErrno { read(pollDescriptor, buffer.baseAddress, buffer.count) }
            }
        ), count > 0 {}
    }
}
