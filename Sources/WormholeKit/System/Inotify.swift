#if os(Linux) || os(Android)
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CWormholeSystem
import SystemPackage

/// An inotify instance and the eventfd that wakes its reader: the kernel calls of ``InotifyMonitor``.
///
/// Both descriptors are close-on-exec; the inotify descriptor blocks, so that a reader with no time-out waits in its
/// `read` (``readEvents(into:waiting:_:)``), one system call per wake-up as a hand-written reader makes. A reader with
/// a time-out waits in ``wait(timeoutMilliseconds:)`` on both descriptors, through an epoll instance that holds them
/// (registered once: a wake-up costs less than a `poll` of both), and ``wake()`` (from any thread) makes that wait
/// return. A blocked `read` is not woken by ``wake()`` but by an event: removing a watch queues one (`IN_IGNORED`).
struct Inotify: Sendable {
    /// The events that wake observers: the file was written, or may no longer be the one at its path.
    static let watchedEvents =
        UInt32(IN_MODIFY) | UInt32(IN_ATTRIB) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF)
        | UInt32(IN_DONT_FOLLOW)
    /// The events that say the watched file may no longer be the one at the path.
    static let replacementEvents =
        UInt32(IN_ATTRIB) | UInt32(IN_DELETE_SELF) | UInt32(IN_MOVE_SELF) | UInt32(IN_IGNORED)

    private let inotify: Int32
    private let wakeUp: Int32
    private let epoll: Int32

    /// Opens an instance; fails with the errno of `inotify_init1` (EMFILE: the user's instance limit) or `eventfd`.
    static func open() -> Result<Inotify, Errno> {
        let inotify = inotify_init1(Int32(IN_CLOEXEC))
        guard inotify >= 0 else { return .failure(currentErrno) }
        let wakeUp = cwormhole_eventfd()
        guard wakeUp >= 0 else {
            let errno = currentErrno
            _ = Glibc_close(inotify)
            return .failure(errno)
        }
        let epoll = cwormhole_epoll_pair(inotify, wakeUp)
        guard epoll >= 0 else {
            let errno = currentErrno
            _ = Glibc_close(inotify)
            _ = Glibc_close(wakeUp)
            return .failure(errno)
        }
        return .success(Inotify(inotify: inotify, wakeUp: wakeUp, epoll: epoll))
    }

    private init(inotify: Int32, wakeUp: Int32, epoll: Int32) {
        self.inotify = inotify
        self.wakeUp = wakeUp
        self.epoll = epoll
    }

    /// Watches the file at `path` (not following a final symbolic link); returns the watch descriptor, the same for
    /// a file watched twice. ENOSPC means the user's watch limit is reached.
    func addWatch(_ path: String) -> Result<Int32, Errno> {
        valueOrErrno(retryOnInterrupt: false) { inotify_add_watch(inotify, path, Self.watchedEvents) }
    }

    /// Stops a watch.
    func removeWatch(_ watch: Int32) {
        _ = inotify_rm_watch(inotify, watch)
    }

    /// Makes the reader's wait return.
    func wake() {
        var one: UInt64 = 1
        _ = Glibc_write(wakeUp, &one, 8)
    }

    /// What ended a wait.
    struct Readiness {
        /// Events are queued.
        var hasEvents = false
        /// ``wake()`` was called.
        var wasWoken = false
        /// The time-out passed with neither.
        var timedOut: Bool { !hasEvents && !wasWoken }
    }

    /// Waits for events or a wake-up, up to `timeoutMilliseconds` (-1: for ever); nil when the wait failed for good.
    /// A wake-up is consumed.
    func wait(timeoutMilliseconds: Int32) -> Readiness? {
        var ready: Int32 = 0
        guard case .success(let count) = valueOrErrno({ cwormhole_epoll_wait_pair(epoll, timeoutMilliseconds, &ready) })
        else {
            return nil
        }
        var readiness = Readiness()
        guard count > 0 else { return readiness }
        if ready & 2 != 0 {
            var value: UInt64 = 0
            _ = Glibc_read(wakeUp, &value, 8)
            readiness.wasWoken = true
        }
        readiness.hasEvents = ready & 1 != 0
        return readiness
    }

    /// Reads every queued event into `buffer`, calling `body` with each event's watch and mask; returns whether the
    /// kernel's queue overflowed (events were dropped), or nil when reading failed for good.
    ///
    /// With `waiting`, the first `read` blocks until an event comes; without, the caller knows that events are
    /// queued (``wait(timeoutMilliseconds:)`` said so). Either way the descriptor is read again only when the last
    /// read left less room than one largest event and a look at the epoll instance finds more, so that no later read
    /// blocks (that look consumes a pending ``wake()``, which only matters to a wait with a time-out, and the
    /// caller's next wait is chosen afresh).
    func readEvents(
        into buffer: UnsafeMutableRawBufferPointer,
        waiting: Bool,
        _ body: (_ watch: Int32, _ mask: UInt32) -> Void
    ) -> Bool? {
        var overflowed = false
        let header = MemoryLayout<inotify_event>.size
        // An event takes at most this much room; a read that left more free emptied the queue.
        let largestEvent = header + Int(NAME_MAX) + 1
        var first = true
        while true {
            let count = Glibc_read(inotify, buffer.baseAddress, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                // A first read that fails cannot wait or read again; a later one leaves the events read so far.
                return first ? nil : overflowed
            }
            first = false
            if count == 0 { return overflowed }
            var offset = 0
            while offset + header <= count {
                let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                if event.mask & UInt32(IN_Q_OVERFLOW) != 0 { overflowed = true }
                body(event.wd, event.mask)
                offset += header + Int(event.len)
            }
            if count < buffer.count - largestEvent { return overflowed }
            guard let more = wait(timeoutMilliseconds: 0), more.hasEvents else { return overflowed }
        }
    }

    /// Closes the descriptors; the instance is not used after this.
    func close() {
        _ = Glibc_close(epoll)
        _ = Glibc_close(inotify)
        _ = Glibc_close(wakeUp)
    }
}

// The C calls by names that the methods above do not shadow.
@inline(__always) private func Glibc_close(_ descriptor: Int32) -> Int32 { close(descriptor) }
@inline(__always) private func Glibc_read(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int
{
    read(descriptor, buffer, count)
}
@inline(__always) private func Glibc_write(_ descriptor: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    write(descriptor, buffer, count)
}
#endif
