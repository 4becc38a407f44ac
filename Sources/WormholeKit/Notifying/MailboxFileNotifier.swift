import Foundation
import Synchronization

/// The directory engine's notifier: a mailbox's own file wakes its listeners, so that a pass writes one file.
///
/// Listeners of a mailbox watch its file, `IDENTIFIER.msg`, with inotify (`IN_MODIFY`), as queue consumers watch their
/// log: the in-place write of a pass is the notification, and ``Wormhole`` posts nothing after a pass through this
/// notifier. A listener creates the file, holding no message, when it is missing, so that it has a file to watch.
/// With polling, the file's header and slot heads are polled. A post of `mailbox.IDENTIFIER` still wakes the
/// listeners, as every ``Notifier`` must: they observe that name through the ``DirectoryNotifier`` as well. Every
/// other name is the ``DirectoryNotifier``'s alone. `FORMAT.md`, "Notifications", has the rule.
///
/// ``DirectoryEngine`` puts it in front of a ``DirectoryNotifier`` on the engine's own directory.
final class MailboxFileNotifier: Notifier, PreparesObservation {
    /// The notifier of every name, mailboxes' included.
    let base: DirectoryNotifier
    /// The mailboxes whose files wake their listeners.
    let files: FileTransiting

    /// A notifier in front of `base`, whose mailboxes are `files`; `base` logs when inotify gives way to polling.
    init(base: DirectoryNotifier, files: FileTransiting) {
        self.base = base
        self.files = files
    }

    func post(_ name: String) throws(WormholeError) {
        try base.post(name)
    }

    func observe(_ name: String, handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        guard let identifier = Self.mailboxIdentifier(in: name) else {
            return try base.observe(name, handler: handler)
        }
        // One call at a time, as a notifier promises: the two observations may run on two threads, when one of them
        // fell back to polling and the other did not. A call that waited for the other is skipped once cancelled;
        // the flag is atomic, not under `serial`, so that a handler may cancel its own observation.
        let serial = Locked(())
        let cancelled = Flag()
        let serialHandler: @Sendable () -> Void = {
            serial.withLock { _ in if !cancelled.isSet { handler() } }
        }
        let posts = try base.observe(name, handler: serialHandler)
        let writes: NotifierObservation
        do throws(WormholeError) {
            writes = try observeFile(of: identifier, handler: serialHandler)
        } catch {
            posts.cancel()
            throw error
        }
        return NotifierObservation {
            _ = cancelled.set()
            writes.cancel()
            posts.cancel()
        }
    }

    /// Makes the mailbox file a listener of `name` will watch, if it is missing: here, before the caller takes its
    /// locks, since making a file flushes it to the disk. A failure is left for ``observe(_:handler:)`` to report.
    func prepareToObserve(_ name: String) {
        guard let identifier = Self.mailboxIdentifier(in: name) else { return }
        files.createEmptyMailbox(identifier: identifier)
    }

    /// The identifier of a mailbox's notification name (`mailbox.IDENTIFIER`), or nil for any other name.
    static func mailboxIdentifier(in name: String) -> String? {
        let prefix = "mailbox."
        guard name.hasPrefix(prefix) else { return nil }
        let identifier = String(name.dropFirst(prefix.count))
        return MessageIdentifier.isValid(identifier) ? identifier : nil
    }

    /// Calls `handler` after each write of the mailbox file, by the notifier's strategy.
    private func observeFile(
        of identifier: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        try base.observe(
            files.handle.filePath(FileTransiting.fileName(identifier)),
            watching: { () throws(WormholeError) in try watch(identifier, handler: handler) },
            polling: { [files] interval in
                PollingMonitor.shared.observe(
                    probe: { files.changeToken(identifier: identifier) },
                    interval: interval,
                    handler: handler
                )
            }
        )
    }

    private func watch(
        _ identifier: String,
        handler: @escaping @Sendable () -> Void
    ) throws(WormholeError) -> NotifierObservation {
        #if os(Linux) || os(Android)
        // Made here, not under the monitor's locks, where the `fsync` of a new file would hold up every wake-up of
        // the process; the monitor makes it again (outside its locks) only if it is removed while watched.
        if let errno = files.createEmptyMailbox(identifier: identifier) {
            throw WormholeError.fileSystem(
                errno,
                "make the mailbox file to watch",
                identifier: identifier,
                path: files.handle.filePath(FileTransiting.fileName(identifier))
            )
        }
        // While the path is watched, a read in a handler of the inotify thread may skip the checks of a descriptor checked
        // before: the events say when the file may have been replaced, or had its links, owner or mode changed.
        let watching = WatchedEntry(files.openEntry(identifier))
        let observation = try InotifyMonitor.shared.observe(
            path: files.handle.filePath(FileTransiting.fileName(identifier)),
            create: { [files] in _ = files.createEmptyMailbox(identifier: identifier) },
            handler: handler,
            watched: { watching.update(isWatched: $0) }
        )
        return NotifierObservation {
            observation.cancel()  // no `watched` call comes after this
            watching.update(isWatched: false)
        }
        #else
        throw WormholeError(.notifierUnavailable, "inotify exists on Linux only.", path: files.directory)
        #endif
    }
}

/// One watch's share in its file's cache entry: counted as a watch of the file while the monitor says the path is
/// watched, and marking the entry's descriptor untrusted whenever the monitor says the file may have changed.
private final class WatchedEntry: Sendable {
    let entry: OpenFileCache.Entry
    private let counted = Atomic<Bool>(false)

    init(_ entry: OpenFileCache.Entry) { self.entry = entry }

    func update(isWatched: Bool) {
        if counted.exchange(isWatched, ordering: .acquiringAndReleasing) == isWatched {
            entry.distrust()
        } else if isWatched {
            entry.beginWatching()
        } else {
            entry.endWatching()
        }
    }
}
