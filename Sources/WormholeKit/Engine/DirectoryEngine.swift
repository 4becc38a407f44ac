import Foundation
import Logging

/// The engine of the processes of one host: every mode in a directory they share.
///
/// Mailboxes are files of two checksummed slots (``FileTransiting``) whose in-place writes wake their listeners
/// (inotify on the file, with polling as the fallback); queues are append-only logs, whose appends wake their
/// consumers; suites are logs too, whose updates are posted through ``DirectoryNotifier``; live messages go through
/// Unix sockets in `.live/`; transfers are staged in `IDENTIFIER.files/`. `FORMAT.md` describes every file, so that
/// other languages can take part.
///
/// ``Wormhole/init(directory:configuration:)`` and ``Wormhole/init(applicationGroupIdentifier:optionalDirectory:configuration:)``
/// make one; make it yourself to share it between wormholes, or to hand it to ``Wormhole/init(engine:coder:sender:logger:)``:
///
/// ```swift
/// let engine = try DirectoryEngine(directory: "/tmp/example-wormhole")
/// let app = Wormhole(engine: engine, sender: "app")
/// ```
public final class DirectoryEngine: WormholeEngine {
    /// The directory of the wormhole's files.
    public let directory: String
    /// File modes, `fsync` and the size limit, which every mode follows.
    public let options: FileTransiting.Options
    public let transiting: any Transiting
    public let notifier: any Notifier

    /// True where the notifier watches the mailbox files themselves (inotify on Linux): a write wakes listeners, and
    /// a pass posts nothing. Only this engine's own files count: a mailbox-file notifier handed to another engine is
    /// posted to as any other.
    public var mailboxWritesWakeListeners: Bool { notifier is MailboxFileNotifier }

    /// ``directory``.
    public var storageDirectory: String? { directory }
    /// The mailboxes' files, which suites share.
    let files: FileTransiting
    /// The directory notifier behind ``notifier``, when there is one: queues then watch their logs instead.
    let directoryNotifier: DirectoryNotifier?
    let logger: Logger

    public var description: String { "directory \(directory)" }

    /// Opens (and by default creates, mode 0700) a directory for every mode.
    ///
    /// - Parameters:
    ///   - directory: The directory's path.
    ///   - coordination: Whether mailbox operations take a directory-wide lock.
    ///   - notification: How listeners learn of changes: inotify (on Apple platforms, Darwin notifications), or
    ///     polling.
    ///   - options: File modes, `fsync` and the size limit.
    ///   - logger: Where warnings go (for example, falling back to polling).
    /// - Throws: ``WormholeError/Code/directoryUnavailable`` when the directory cannot be created or written,
    ///   ``WormholeError/Code/untrustedFile`` when it is a link or another user's.
    public convenience init(
        directory: String,
        coordination: Wormhole.Configuration.Coordination = .none,
        notification: DirectoryNotifier.Strategy = .automatic,
        options: FileTransiting.Options = .init(),
        logger: Logger = Logger(label: "wormhole")
    ) throws(WormholeError) {
        let transiting: any Transiting
        let files: FileTransiting
        switch coordination {
        case .none:
            files = try FileTransiting(directory: directory, options: options)
            transiting = files
        case .coordinated:
            let coordinated = try CoordinatedFileTransiting(directory: directory, options: options)
            files = coordinated.files
            transiting = coordinated
        }
        let notifier = try DirectoryNotifier(
            directory: directory,
            strategy: notification,
            options: options,
            logger: logger
        )
        self.init(files: files, transiting: transiting, notifier: notifier, logger: logger)
    }

    /// An engine on the directory of a file transiting, with the given notifier.
    ///
    /// A ``DirectoryNotifier`` on the same directory goes behind a ``MailboxFileNotifier``, so that mailbox files wake
    /// their own listeners and a pass writes no notification file.
    init(files: FileTransiting, transiting: any Transiting, notifier: any Notifier, logger: Logger) {
        self.directory = files.directory
        self.options = files.options
        self.files = files
        self.transiting = transiting
        let base = (notifier as? MailboxFileNotifier)?.base ?? (notifier as? DirectoryNotifier)
        #if os(Linux) || os(Android)
        if let base, base.handle.isEntry(DirectoryNotifier.subdirectoryName, of: files.handle) {
            self.notifier = MailboxFileNotifier(base: base, files: files)
        } else {
            self.notifier = base ?? notifier
        }
        #else
        // No inotify: a mailbox file's write wakes nobody by itself, so a pass posts its name.
        self.notifier = base ?? notifier
        #endif
        self.directoryNotifier = base
        self.logger = logger
    }

    /// The engine of a wormhole made from parts, when its transiting keeps a directory.
    static func fromParts(transiting: any Transiting, notifier: any Notifier, logger: Logger) -> DirectoryEngine? {
        let files: FileTransiting
        switch transiting {
        case let plain as FileTransiting: files = plain
        case let coordinated as CoordinatedFileTransiting: files = coordinated.files
        default: return nil
        }
        return DirectoryEngine(files: files, transiting: transiting, notifier: notifier, logger: logger)
    }

    public func queueLog(
        _ identifier: String,
        sender: String,
        retention: Duration
    ) throws(WormholeError) -> any QueueLog {
        #if os(Linux) || os(Android)
        let wakeSource: DirectoryQueueLog.WakeSource =
            if let directoryNotifier { .logFile(directoryNotifier.strategy) } else { .notifier(notifier) }
        #else
        // No inotify: an append posts `queue.IDENTIFIER`, which the directory's notifier carries.
        let wakeSource = DirectoryQueueLog.WakeSource.notifier(notifier)
        #endif
        return try DirectoryQueueLog(
            directory: try DirectoryHandle.open(path: directory, create: true, options: options),
            identifier: identifier,
            sender: sender,
            retention: retention,
            wakeSource: wakeSource,
            logger: logger
        )
    }

    public func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore {
        try DirectorySuiteStore(name: name, files: files, notifier: notifier)
    }

    public func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport {
        DirectoryLiveTransport(path: directory, options: options, sender: sender)
    }

    public func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging {
        try DirectoryTransferStaging(
            directory: try DirectoryHandle.open(path: directory, create: true, options: options),
            identifier: identifier
        )
    }
}
