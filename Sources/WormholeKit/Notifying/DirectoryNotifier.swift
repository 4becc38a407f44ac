import Foundation
import Logging
import Synchronization
import SystemPackage

/// The default notifier on Linux: a post writes a small file, observers are woken by inotify.
///
/// Each notification name is a file in the hidden `.notifications` subdirectory of the wormhole directory.
/// ``post(_:)`` writes 8 fresh bytes into it in place; ``observe(_:handler:)`` watches that file with inotify (the
/// file, not the directory, so a post wakes only that name's observers), on one monitor thread per process that
/// waits in a blocking `read` of its inotify descriptor and retires, closing its descriptors, a moment after its last
/// observation ends,
/// so no blocking call ever runs on Swift's cooperative thread pool. Wormholes in one process and in different
/// processes wake each other alike.
///
/// On a ``DirectoryEngine`` whose mailboxes are in this notifier's directory, a pass posts nothing: the mailbox
/// file's own write wakes its listeners, who watch that file as well as the name `mailbox.IDENTIFIER` (so a post of
/// the name still wakes them). Suites post through this notifier, and a shared store through one of its own.
///
/// A notification name follows the identifier rules (``MessageIdentifier``) with a longer limit,
/// ``MessageIdentifier/maximumNotificationNameLength``, so that the name of any valid identifier with its prefix
/// (`mailbox.` and the like) is valid too.
///
/// When inotify cannot be used (its instance or watch limits are exhausted), the ``Strategy/automatic`` strategy logs
/// a warning and falls back to polling the files' contents.
///
/// On Apple platforms, which have no inotify, a post also posts a Darwin notification (`notify(3)`) named by the
/// directory's resolved path and the name, and ``Strategy/automatic`` and ``Strategy/inotify`` observe that; a file
/// written by its owner there wakes nobody by itself, so every write that should wake its readers is followed by a
/// post. Polling still reads the files, which every post writes, so pollers and observers of Darwin notifications
/// meet.
public final class DirectoryNotifier: Notifier {
    /// How observers learn of posts.
    public enum Strategy: Sendable, Hashable {
        /// inotify where it works, polling every 50 ms where it does not (with a logged warning); on Apple platforms,
        /// Darwin notifications.
        case automatic
        /// inotify only: observing fails with ``WormholeError/Code/notifierUnavailable`` when it cannot be used. On
        /// Apple platforms, Darwin notifications, as ``automatic``.
        case inotify
        /// Polling only, at the given interval: for file systems that inotify does not see into (network ones).
        case polling(interval: Duration)
    }

    /// The name of the subdirectory that holds the notification files.
    public static let subdirectoryName = ".notifications"
    /// The polling interval of the fallback.
    public static let fallbackPollingInterval: Duration = .milliseconds(50)

    /// The wormhole directory whose `.notifications` subdirectory this notifier uses.
    public let directory: String
    /// How observers are woken.
    public let strategy: Strategy
    let handle: DirectoryHandle
    private let logger: Logger
    private let openFiles = OpenFileCache()
    private let tokenBase = UInt64.random(in: 0...UInt64.max)
    private let tokenCounter = Atomic<UInt64>(0)
    #if canImport(Darwin)
    /// The Darwin notification names start with this: the directory's resolved path.
    private let darwinDirectory: String
    #endif

    /// Creates a notifier for a wormhole directory, creating its `.notifications` subdirectory (mode 0700).
    ///
    /// - Throws: ``WormholeError/Code/directoryUnavailable`` or ``WormholeError/Code/untrustedFile`` as
    ///   ``FileTransiting/init(directory:options:createDirectory:)`` does.
    public init(
        directory: String,
        strategy: Strategy = .automatic,
        options: FileTransiting.Options = .init(),
        logger: Logger = Logger(label: "wormhole.notifier")
    ) throws(WormholeError) {
        self.directory = directory
        self.strategy = strategy
        self.logger = logger
        self.handle = try DirectoryHandle.open(
            path: directory + "/" + Self.subdirectoryName,
            create: true,
            options: options
        )
        #if canImport(Darwin)
        darwinDirectory = DarwinNotifications.resolvedPath(directory)
        #endif
    }

    public func post(_ name: String) throws(WormholeError) {
        try MessageIdentifier.validateNotificationName(name)
        // A fresh value each time, so that a poller can tell one post from the next.
        let token = PollingMonitor.token(tokenBase &+ tokenCounter.add(1, ordering: .relaxed).newValue)
        try openFiles.entry(name).descriptor.withLock { (cached) throws(WormholeError) in
            for _ in 0..<100 {
                if cached < 0 {
                    do throws(Errno) {
                        cached = try handle.openFile(named: name, flags: O_WRONLY | O_CREAT).release()
                    } catch {
                        throw WormholeError.fileSystem(error, "open the notification file", path: handle.filePath(name))
                    }
                }
                let file = Descriptor(rawValue: cached)
                // A removed file would swallow the post: check that the name still leads to this file.
                guard case .success(let status) = file.status(), status.linkCount > 0 else {
                    closeCached(&cached)
                    continue
                }
                if case .failure(let errno) = file.write(token, at: 0) {
                    closeCached(&cached)
                    throw WormholeError.fileSystem(errno, "write the notification file", path: handle.filePath(name))
                }
                #if canImport(Darwin)
                // No inotify: the write wakes pollers, the Darwin notification everyone else.
                try DarwinNotifications.post(DarwinNotifications.name(name, inResolvedDirectory: darwinDirectory))
                #endif
                return
            }
            // Another process kept removing the file under us: say so rather than drop the post.
            throw WormholeError(
                .ioFailure,
                "The notification file kept being removed while posting; listeners may not have been woken.",
                path: handle.filePath(name)
            )
        }
    }

    public func observe(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        try MessageIdentifier.validateNotificationName(name)
        return try observe(
            handle.filePath(name),
            watching: { () throws(WormholeError) in try observeWithInotify(name, handler: handler) },
            polling: { [handle] interval in
                PollingMonitor.shared.observe(handle, name: name, interval: interval, handler: handler)
            }
        )
    }

    /// Observes a file by this notifier's strategy: `watching` it with inotify, or `polling` it at an interval, or
    /// (``Strategy/automatic``) watching it, and polling it with a logged warning when inotify cannot be used.
    func observe(
        _ path: String,
        watching: () throws(WormholeError) -> NotifierObservation,
        polling: (Duration) -> NotifierObservation
    ) throws(WormholeError) -> NotifierObservation {
        switch strategy {
        case .polling(let interval):
            return polling(interval)
        case .inotify:
            return try watching()
        case .automatic:
            do {
                return try watching()
            } catch {
                logger.warning(
                    "inotify is unavailable; polling for changes instead, which adds latency",
                    metadata: [
                        "path": "\(path)", "cause": "\(error.message)", "interval": "\(Self.fallbackPollingInterval)",
                    ]
                )
                return polling(Self.fallbackPollingInterval)
            }
        }
    }

    private func observeWithInotify(
        _ name: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        #if os(Linux) || os(Android)
        // The file is created through the directory handle, with the wormhole's modes and group.
        return try InotifyMonitor.shared.observe(
            path: handle.filePath(name),
            create: { [handle] in handle.touchFile(named: name) },
            handler: handler
        )
        #elseif canImport(Darwin)
        return try DarwinNotifications.observe(
            DarwinNotifications.name(name, inResolvedDirectory: darwinDirectory),
            handler: handler
        )
        #else
        throw WormholeError(.notifierUnavailable, "inotify exists on Linux only.", path: handle.path)
        #endif
    }
}
