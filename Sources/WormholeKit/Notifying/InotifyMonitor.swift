#if os(Linux) || os(Android)
import CWormholeSystem
import Foundation
import Synchronization

/// The process's one inotify instance and the thread that waits on it.
///
/// Each observed file (a notification file, a queue's log, a mailbox) is watched on its own (not its directory), so
/// a write wakes only the processes that observe that file, and a process is never woken by its own writes to
/// other files. The thread starts with the first observation. When the last one ends it lingers for ``idleTimeout``
/// milliseconds (listening often stops and starts again at once), then retires, closing its descriptors: listening
/// and stopping leaves no descriptor behind, and never piles up inotify instances, of which a user may have only 128.
/// While it has observations and no broken watch it waits in a blocking `read` of the inotify descriptor, one system
/// call per wake-up; the last observation of a file that ends removes its watch, which queues the event (`IN_IGNORED`)
/// that wakes the read. Otherwise (to retire, or to try a broken watch again) it waits with a time-out in
/// `epoll_wait(2)` on the inotify descriptor and an eventfd, which the last observation's end writes to.
/// Handlers run on this thread, one at a time, and so do the callbacks they schedule with
/// ``CallbackExecution/automatic``, after each handler returns; when such a callback blocks, ``CallbackWatchdog`` has
/// a new thread take over the waiting and the handlers. A watched file that is replaced is watched again at its path;
/// one that goes and cannot be made again is tried again after each wake-up, at least every ``repairInterval``
/// milliseconds.
final class InotifyMonitor: Sendable {
    static let shared = InotifyMonitor()

    private let current = Locked<Instance?>(nil)
    private let nextID = Atomic<UInt64>(1)
    /// How long an instance with no observations lingers before it retires, in milliseconds.
    static let idleTimeout: Int32 = 200
    /// How often a watch whose file went, and could not be watched again, is tried again, in milliseconds.
    static let repairInterval: Int32 = 50

    /// A test hook: with `WORMHOLE_TEST_INOTIFY_EXHAUSTED` set, inotify fails as when its limits are reached, so that
    /// tests can see the polling fallback take over in a real process.
    static let simulatesExhaustion = ProcessInfo.processInfo.environment["WORMHOLE_TEST_INOTIFY_EXHAUSTED"] != nil

    /// Watches the file at `path`, which `create` creates if it is missing (again if it is replaced); the handler
    /// runs after each modification of it.
    ///
    /// `watched`, when given, is told whether the file at `path` is watched: true once the watch is made (false if
    /// that watch is already broken), then again (true, or false when the path cannot be watched now) each time an
    /// event says the file may no longer be the one watched or had its links, owner or mode changed, and after the
    /// kernel dropped events; true when a path that could not be watched is watched again. It is called with the monitor's lock held, after the path is
    /// watched anew and before the handlers of the same wake-up run, and never after the observation is cancelled.
    func observe(
        path: String,
        create: @escaping @Sendable () -> Void,
        handler: @escaping @Sendable () -> Void,
        watched: (@Sendable (_ isWatched: Bool) -> Void)? = nil
    ) throws(WormholeError) -> NotifierObservation {
        if Self.simulatesExhaustion {
            throw WormholeError(
                .notifierUnavailable,
                "inotify's limits are reached (simulated by WORMHOLE_TEST_INOTIFY_EXHAUSTED).",
                path: path
            )
        }
        let id = nextID.add(1, ordering: .relaxed).newValue
        let instance = try current.withLock { (current) throws(WormholeError) -> Instance in
            if let running = current {
                try running.add(id: id, path: path, create: create, handler: handler, watched: watched)
                return running
            }
            let started = try Instance()
            do throws(WormholeError) {
                try started.add(id: id, path: path, create: create, handler: handler, watched: watched)
            } catch {
                // Its thread never started, so nothing else closes its descriptors: a process whose watches fail
                // (the watch limit reached) would otherwise leak three per try, and then inotify instances.
                started.discard()
                throw error
            }
            started.start()
            current = started
            return started
        }
        return NotifierObservation {
            // The last observation wakes the thread, which retires after a while unless a new one comes.
            if instance.remove(id: id) { instance.wake() }
        }
    }

    /// Whether the calling thread is running a handler of the monitor: a read made there follows every event the
    /// monitor read before it, so that a `watched` call for a change of the file came before it.
    static var isRunningHandler: Bool { cwormhole_inotify_handler_running() != 0 }

    /// Called by an instance's thread that cannot wait on its descriptor any more, before it closes it: the next
    /// observation starts a new instance rather than use the closed descriptors.
    fileprivate func abandon(_ instance: Instance) {
        current.withLock { current in
            if current === instance { current = nil }
        }
    }

    /// Called by an idle instance's thread: retires it if it is still idle. Observations are added under the same
    /// lock, so none can be added to an instance that is retiring.
    fileprivate func retire(_ instance: Instance) -> Bool {
        current.withLock { current in
            guard current === instance, instance.isIdle else { return false }
            current = nil
            return true
        }
    }

    /// One inotify descriptor, its wake-up eventfd, its watches and its thread.
    final class Instance: Sendable {
        private struct Watch {
            var path: String
            var create: @Sendable () -> Void
            var handlers: [UInt64: Handler] = [:]
        }
        /// A handler, wrapped: a bare closure moved from the dictionary to a wake-up's array was converted twice on
        /// the way (from and to the containers' generic representation), two allocations per handler per wake-up.
        private struct Handler {
            let run: @Sendable () -> Void
            let watched: (@Sendable (_ isWatched: Bool) -> Void)?
        }
        private struct Registry {
            var watches: [Int32: Watch] = [:]
            var byID: [UInt64: Int32] = [:]
            /// Watches whose file went and could not be watched again yet (it could not be made again, say): they
            /// are tried again every ``InotifyMonitor/repairInterval`` milliseconds, outside the lock.
            var broken: Set<Int32> = []
        }

        private let inotify: Inotify
        private let registry = Locked(Registry())

        init() throws(WormholeError) {
            switch Inotify.open() {
            case .success(let opened): inotify = opened
            case .failure(let errno):
                throw WormholeError(
                    .notifierUnavailable,
                    "inotify could not be opened (\(errno)); the limit fs.inotify.max_user_instances may be reached.",
                    underlyingError: errno
                )
            }
        }

        func add(
            id: UInt64,
            path: String,
            create: @escaping @Sendable () -> Void,
            handler: @escaping @Sendable () -> Void,
            watched: (@Sendable (_ isWatched: Bool) -> Void)?
        ) throws(WormholeError) {
            try registry.withLock { (registry) throws(WormholeError) in
                let watch = try addWatch(path, create: create)
                // Watching one file twice gives the same descriptor: the handlers share it.
                registry.watches[watch, default: Watch(path: path, create: create)].handlers[id] = Handler(
                    run: handler,
                    watched: watched
                )
                registry.byID[id] = watch
                // A watch already broken (the file went since it was watched) is not one the file is watched by.
                watched?(!registry.broken.contains(watch))
            }
        }

        /// Creates the file if it is missing, and watches it; returns the watch descriptor.
        private func addWatch(_ path: String, create: () -> Void) throws(WormholeError) -> Int32 {
            create()
            switch inotify.addWatch(path) {
            case .success(let watch):
                return watch
            case .failure(let errno):
                throw WormholeError(
                    .notifierUnavailable,
                    errno == .noSpace
                        ? "inotify's watch limit (fs.inotify.max_user_watches) is reached."
                        : "inotify_add_watch failed: \(errno).",
                    path: path,
                    underlyingError: errno
                )
            }
        }

        /// Ends one observation; returns true when it was the last.
        func remove(id: UInt64) -> Bool {
            registry.withLock { registry in
                guard let watch = registry.byID.removeValue(forKey: id) else { return registry.byID.isEmpty }
                registry.watches[watch]?.handlers[id] = nil
                if registry.watches[watch]?.handlers.isEmpty == true {
                    registry.watches[watch] = nil
                    if registry.broken.remove(watch) == nil { inotify.removeWatch(watch) }
                }
                return registry.byID.isEmpty
            }
        }

        var isIdle: Bool { registry.withLock { $0.byID.isEmpty } }

        /// How long the thread waits for events: forever, or until a broken watch is tried again, or until an idle
        /// instance retires.
        private var waitTimeout: Int32 {
            registry.withLock { registry in
                if registry.byID.isEmpty { return InotifyMonitor.idleTimeout }
                return registry.broken.isEmpty ? -1 : InotifyMonitor.repairInterval
            }
        }

        func start() {
            startThread(handingOver: nil)
        }

        /// Starts a thread that waits on the descriptor and runs the handlers; `handingOver` is the work of a thread
        /// whose callback blocked (nil for the first thread), which this one runs first, before calling every handler
        /// once for the events that thread had read and not handled yet.
        private func startThread(handingOver handedOver: [InlineScheduler]?) {
            Thread { [self] in
                nameCurrentThread("wh-inotify")
                run(handingOver: handedOver)
            }.start()
        }

        /// Wakes the thread in `epoll_wait`, so that it notices it is idle; a thread blocked in `read` is woken by the
        /// event that removing the last watch queued.
        func wake() { inotify.wake() }

        /// Closes the descriptors of an instance whose thread was never started.
        func discard() { inotify.close() }

        /// The arrays a wake-up fills, kept by the thread from one wake-up to the next: a wake-up allocates nothing.
        private struct Scratch {
            var woken: [Int32] = []
            var replaced: [Int32] = []
            var chosen: [(id: UInt64, handler: Handler)] = []

            init() {
                woken.reserveCapacity(8)
                replaced.reserveCapacity(8)
                chosen.reserveCapacity(8)
            }
        }

        private func run(handingOver handedOver: [InlineScheduler]?) {
            let driver = CallbackDriver { [self] rest in startThread(handingOver: rest) }
            driver.install()
            var scratch = Scratch()
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 8)
            defer {
                buffer.deallocate()
                driver.uninstall()
                // A thread that was taken over leaves the descriptors to the one that took over.
                if !driver.isReplaced { inotify.close() }
            }
            if let handedOver {
                for scheduler in handedOver { _ = driver.enqueue(scheduler) }
                driver.runDeferred()
                if runHandlers(wakingEveryone: true, scratch: &scratch, driver: driver) {
                    repairBrokenWatches(driver: driver)
                }
            }
            while !driver.isReplaced {
                let timeout = waitTimeout
                if timeout < 0 {
                    // Observed, nothing broken: the read itself waits. An observation that ends queues an event,
                    // so an instance that became idle meanwhile is woken and goes on to wait with a time-out.
                    guard let broken = readEvents(buffer, waiting: true, scratch: &scratch, driver: driver) else {
                        InotifyMonitor.shared.abandon(self)
                        return
                    }
                    if broken { repairBrokenWatches(driver: driver) }
                    continue
                }
                guard let readiness = inotify.wait(timeoutMilliseconds: timeout) else {
                    InotifyMonitor.shared.abandon(self)
                    return
                }
                if readiness.timedOut {
                    if isIdle {
                        if InotifyMonitor.shared.retire(self) { return }
                        continue
                    }
                    repairBrokenWatches(driver: driver)  // the wait ends early only while a watch is broken
                }
                if readiness.hasEvents, readEvents(buffer, waiting: false, scratch: &scratch, driver: driver) == true {
                    repairBrokenWatches(driver: driver)
                }
            }
        }

        /// Reads every queued event (first waiting for one, when `waiting`), then calls each affected handler once:
        /// a burst of posts wakes a handler once, which is enough, as it reads the newest state. Returns whether a
        /// watch is broken, or nil when the descriptor cannot be read any more.
        private func readEvents(
            _ buffer: UnsafeMutableRawBufferPointer,
            waiting: Bool,
            scratch: inout Scratch,
            driver: CallbackDriver
        ) -> Bool? {
            // A wake-up concerns a watch or two: arrays searched in line cost less than sets hashed.
            scratch.woken.removeAll(keepingCapacity: true)
            scratch.replaced.removeAll(keepingCapacity: true)
            let read = inotify.readEvents(into: buffer, waiting: waiting) { watch, mask in
                if !scratch.woken.contains(watch) { scratch.woken.append(watch) }
                if mask & Inotify.replacementEvents != 0, !scratch.replaced.contains(watch) {
                    scratch.replaced.append(watch)
                }
            }
            guard let overflowed = read else { return nil }
            // After an overflow the kernel dropped events, a file's replacement among them: wake everyone, who will
            // read the newest state, and look at every watched path again.
            return runHandlers(wakingEveryone: overflowed, scratch: &scratch, driver: driver)
        }

        /// Calls the handlers of the watches in `scratch.woken` (of every watch when `wakingEveryone`), each once, and
        /// after each the callbacks it scheduled; stops when the driver is replaced meanwhile, as the new thread calls
        /// every handler once. Returns whether a watch is broken (read under the same lock, so that a wake-up takes it
        /// once).
        @discardableResult
        private func runHandlers(wakingEveryone: Bool, scratch: inout Scratch, driver: CallbackDriver) -> Bool {
            // A thread taken over (a callback it handed on blocked too) leaves the watches to the one that took over,
            // which may be blocked in `read`: a watch this thread marked broken would queue no event to wake it.
            if driver.isReplaced { return false }
            scratch.chosen.removeAll(keepingCapacity: true)
            let hasBroken = registry.withLock { registry in
                // A handler belongs to one watch (`byID`), so the groups never share one: no merging, only an order.
                if wakingEveryone {
                    scratch.woken = Array(registry.watches.keys)
                    scratch.replaced = scratch.woken
                }
                for watch in scratch.woken {
                    guard let handlers = registry.watches[watch]?.handlers else { continue }
                    for (id, handler) in handlers { scratch.chosen.append((id, handler)) }
                }
                if scratch.chosen.count > 1 { scratch.chosen.sort { $0.id < $1.id } }
                for watch in scratch.replaced { rewatchIfReplaced(watch, in: &registry) }
                return !registry.broken.isEmpty
            }
            call(scratch.chosen, driver: driver)
            // The handlers are not kept past their wake-up (a cancelled observation's is released with it).
            scratch.chosen.removeAll(keepingCapacity: true)
            return hasBroken
        }

        /// The watched file was removed, renamed or had its links changed, or the kernel ended the watch: watch the
        /// path again. `inotify_add_watch` gives back the same descriptor while the path leads to the file watched;
        /// another descriptor means another file, which takes the handlers. No file at the path (or none that can be
        /// watched) leaves the entry broken, to be made and watched again outside the lock.
        private func rewatchIfReplaced(_ watch: Int32, in registry: inout Registry) {
            guard let entry = registry.watches[watch], !registry.broken.contains(watch) else { return }
            // Told after the path is watched anew, not before: a check made in between would be of a file that a
            // replacement right then leaves unwatched.
            defer {
                let isWatched = !registry.broken.contains(watch)
                for handler in entry.handlers.values { handler.watched?(isWatched) }
            }
            switch inotify.addWatch(entry.path) {
            case .success(let newWatch) where newWatch == watch:
                return  // the same file: its links or attributes changed, nothing more
            case .success(let newWatch):
                move(entry, from: watch, to: newWatch, in: &registry)
            case .failure(let errno):
                // No file at the path: the watch's events are gone with the file (the kernel ends the watch once it
                // is deleted, or may still). Another failure (the watch limit, memory) keeps a watch that may still
                // work; either way the path is tried again.
                if errno == .noSuchFileOrDirectory || errno == .notDirectory { inotify.removeWatch(watch) }
                registry.broken.insert(watch)
            }
        }

        private func move(_ entry: Watch, from watch: Int32, to newWatch: Int32, in registry: inout Registry) {
            registry.watches[watch] = nil
            inotify.removeWatch(watch)
            var moved = registry.watches[newWatch] ?? Watch(path: entry.path, create: entry.create)
            moved.handlers.merge(entry.handlers) { first, _ in first }
            registry.watches[newWatch] = moved
            for id in entry.handlers.keys { registry.byID[id] = newWatch }
        }

        /// Makes the files of broken watches again (outside the lock: making a file may flush it to the disk) and
        /// watches them, then calls their handlers, which may have missed writes meanwhile. It runs after each
        /// wake-up, and the wait ends after ``InotifyMonitor/repairInterval`` milliseconds while any is broken.
        private func repairBrokenWatches(driver: CallbackDriver) {
            // A thread taken over leaves the repairs to the new one, which calls the repaired handlers.
            if driver.isReplaced { return }
            let pending = registry.withLock { registry in
                registry.broken.compactMap { watch in registry.watches[watch].map { (watch, $0.create) } }
            }
            guard !pending.isEmpty else { return }
            for (_, create) in pending { create() }
            let handlers: [UInt64: Handler] = registry.withLock { registry in
                var repaired: [UInt64: Handler] = [:]
                for (watch, _) in pending {
                    guard registry.broken.contains(watch), let entry = registry.watches[watch],
                        case .success(let newWatch) = inotify.addWatch(entry.path)
                    else { continue }
                    registry.broken.remove(watch)
                    // The file may have been made again, and replaced again, while it was not watched.
                    for handler in entry.handlers.values { handler.watched?(true) }
                    // The same descriptor: the watch kept (its failure was not the file's) still holds.
                    if newWatch != watch { move(entry, from: watch, to: newWatch, in: &registry) }
                    repaired.merge(entry.handlers) { first, _ in first }
                }
                return repaired
            }
            call(handlers.sorted { $0.key < $1.key }.map { (id: $0.key, handler: $0.value) }, driver: driver)
        }

        /// Calls each handler once, in the order given (their observations', as callers sort them by id), and after
        /// each the callbacks it scheduled; stops when the driver is replaced meanwhile, as the new thread calls every
        /// handler once.
        private func call(_ handlers: [(id: UInt64, handler: Handler)], driver: CallbackDriver) {
            for (id, handler) in handlers {
                if driver.isReplaced { return }
                // A handler cancelled by an earlier handler (or callback) in this batch is skipped.
                if registry.withLock({ $0.byID[id] != nil }) {
                    cwormhole_set_inotify_handler_running(1)
                    handler.run()
                    cwormhole_set_inotify_handler_running(0)
                    driver.runDeferred()
                }
            }
        }
    }
}
#endif
