#if os(Linux) || os(Android)
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CWormholeSystem
import Foundation
import Synchronization

/// The process's one inotify instance and the thread that waits on it.
///
/// The thread starts with the first observation and stops, closing its descriptors, when the last one ends, so
/// listening and stopping leaves no descriptor behind. It waits in `poll(2)` on the inotify descriptor and an
/// eventfd; writing the eventfd wakes it to stop. Handlers run on this thread, one at a time.
final class InotifyMonitor: Sendable {
    static let shared = InotifyMonitor()

    private let current = Mutex<Instance?>(nil)
    private let nextID = Atomic<UInt64>(1)

    /// Watches `name` in `directory`; the handler runs after each modification of that file.
    func observe(
        directory: String, name: String, handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let id = nextID.add(1, ordering: .relaxed).newValue
        let instance = try current.withLock { (current) throws(WormholeError) -> Instance in
            if let running = current { 
                try running.add(id: id, directory: directory, name: name, handler: handler)
                return running
            }
            let started = try Instance()
            try started.add(id: id, directory: directory, name: name, handler: handler)
            started.start()
            current = started
            return started
        }
        return NotifierObservation { [self] in
            current.withLock { current in
                // The last observation stops the thread; the next observation starts a new instance.
                if instance.remove(id: id), current === instance {
                    instance.stop()
                    current = nil
                }
            }
        }
    }

    /// One inotify descriptor, its wake-up eventfd, its watches and its thread.
    final class Instance: Sendable {
        private struct Watch {
            var handlers: [String: [UInt64: @Sendable () -> Void]] = [:]
            var count = 0
        }
        private struct Registry {
            var watches: [Int32: Watch] = [:]
            var names: [UInt64: (descriptor: Int32, name: String)] = [:]
            var stopping = false
        }

        private let inotifyDescriptor: Int32
        private let wakeDescriptor: Int32
        private let registry = Mutex(Registry())

        init() throws(WormholeError) {
            let inotify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
            guard inotify >= 0 else {
                throw WormholeError(
                    .notifierUnavailable,
                    "inotify_init1 failed (\(currentErrno)); the limit fs.inotify.max_user_instances may be reached.",
                    underlyingError: currentErrno)
            }
            let wake = cwormhole_eventfd()
            guard wake >= 0 else {
                let errno = currentErrno
                _ = close(inotify)
                throw WormholeError(.notifierUnavailable, "eventfd failed (\(errno)).", underlyingError: errno)
            }
            inotifyDescriptor = inotify
            wakeDescriptor = wake
        }

        func add(
            id: UInt64, directory: String, name: String, handler: @escaping @Sendable () -> Void
        ) throws(WormholeError) {
            try registry.withLock { (registry) throws(WormholeError) in
                let mask = UInt32(IN_MODIFY) | UInt32(IN_ONLYDIR) | UInt32(IN_DONT_FOLLOW)
                let watch = inotify_add_watch(inotifyDescriptor, directory, mask)
                guard watch >= 0 else {
                    let errno = currentErrno
                    throw WormholeError(
                        .notifierUnavailable,
                        errno == .noSpace
                            ? "inotify's watch limit (fs.inotify.max_user_watches) is reached."
                            : "inotify_add_watch failed: \(errno).",
                        path: directory, underlyingError: errno)
                }
                // Watching one directory twice gives the same descriptor: count the users.
                registry.watches[watch, default: Watch()].handlers[name, default: [:]][id] = handler
                registry.watches[watch]!.count += 1
                registry.names[id] = (watch, name)
            }
        }

        /// Ends one observation; returns true when it was the last.
        func remove(id: UInt64) -> Bool {
            registry.withLock { registry in
                guard let (watch, name) = registry.names.removeValue(forKey: id) else { return registry.names.isEmpty }
                registry.watches[watch]?.handlers[name]?[id] = nil
                if registry.watches[watch]?.handlers[name]?.isEmpty == true {
                    registry.watches[watch]?.handlers[name] = nil
                }
                registry.watches[watch]?.count -= 1
                if registry.watches[watch]?.count == 0 {
                    registry.watches[watch] = nil
                    _ = inotify_rm_watch(inotifyDescriptor, watch)
                }
                return registry.names.isEmpty
            }
        }

        func start() {
            Thread { [self] in
                Thread.current.name = "wh-inotify"  // pthread names hold 15 characters
                run()
            }.start()
        }

        func stop() {
            registry.withLock { $0.stopping = true }
            var one: UInt64 = 1
            _ = write(wakeDescriptor, &one, 8)
        }

        private func run() {
            var descriptors = [
                pollfd(fd: inotifyDescriptor, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeDescriptor, events: Int16(POLLIN), revents: 0),
            ]
            let bufferSize = 64 * 1024
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: bufferSize, alignment: 8)
            defer {
                buffer.deallocate()
                _ = close(inotifyDescriptor)
                _ = close(wakeDescriptor)
            }
            while true {
                let ready = poll(&descriptors, 2, -1)
                if ready < 0 {
                    if errno == EINTR { continue }
                    return
                }
                if descriptors[1].revents != 0 {
                    var value: UInt64 = 0
                    _ = read(wakeDescriptor, &value, 8)
                    if registry.withLock({ $0.stopping }) { return }
                }
                if descriptors[0].revents != 0 { drainEvents(buffer, size: bufferSize) }
            }
        }

        /// Reads every queued event, then calls each affected handler once: a burst of posts wakes a handler
        /// once, which is enough, as it reads the newest state.
        private func drainEvents(_ buffer: UnsafeMutableRawPointer, size: Int) {
            var keys: [(Int32, String)] = []
            var overflowed = false
            // An event takes at most this much room; a read that left more free emptied the queue.
            let largestEvent = MemoryLayout<inotify_event>.size + Int(NAME_MAX) + 1
            while true {
                let count = read(inotifyDescriptor, buffer, size)
                if count <= 0 { break }
                var offset = 0
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                    let nameStart = buffer + offset + MemoryLayout<inotify_event>.size
                    if event.mask & UInt32(IN_Q_OVERFLOW) != 0 { overflowed = true }
                    if event.len > 0 {
                        let name = String(cString: nameStart.assumingMemoryBound(to: CChar.self))
                        keys.append((event.wd, name))
                    }
                    offset += MemoryLayout<inotify_event>.size + Int(event.len)
                }
                if count < size - largestEvent { break }
            }
            let handlers: [UInt64: @Sendable () -> Void] = registry.withLock { registry in
                var chosen: [UInt64: @Sendable () -> Void] = [:]
                if overflowed {
                    // The kernel dropped events: wake everyone, who will read the newest state.
                    for watch in registry.watches.values {
                        for group in watch.handlers.values { chosen.merge(group) { first, _ in first } }
                    }
                }
                for (watch, name) in keys {
                    if let group = registry.watches[watch]?.handlers[name] { chosen.merge(group) { first, _ in first } }
                }
                return chosen
            }
            for id in handlers.keys.sorted() {
                // A handler cancelled by an earlier handler in this batch is skipped.
                if registry.withLock({ $0.names[id] != nil }) { handlers[id]!() }
            }
        }
    }
}
#endif
