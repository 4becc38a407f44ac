import Foundation
import Logging
import Synchronization

/// A set of mailboxes shared by cooperating processes: pass a message in one, read it or be told of it in another.
///
/// This is MMWormhole for Swift, on Linux and Apple platforms. An identifier names a mailbox; passing a message
/// replaces the mailbox's content and wakes every listener of that identifier, in this process and in the others.
///
/// ```swift
/// struct Tap: Codable, Sendable { var number: Int }
///
/// let wormhole = try Wormhole(applicationGroupIdentifier: "group.com.example.app", optionalDirectory: "wormhole")
/// try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
///
/// // In another process:
/// let tap = try wormhole.message(withIdentifier: "button", as: Tap.self)   // nil when the mailbox is empty
/// let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self) { tap in
///     print("tapped", tap.number)
/// }
/// ```
///
/// Messages are `Codable` values, JSON-encoded by default, so the `wormhole` command-line tool and other languages
/// can read and write them. Failures throw ``WormholeError``: a wormhole never fails silently.
///
/// A wormhole is `Sendable`: use one instance from any thread or task.
public final class Wormhole: Sendable {
    /// The engine that stores and wakes every mode of this wormhole.
    public let engine: any WormholeEngine
    /// Where the messages are stored: the engine's mailboxes.
    public let transiting: any Transiting
    /// How other processes are told of new messages: the engine's notifier.
    public let notifier: any Notifier
    /// How messages are encoded.
    public let coder: any MessageCoder
    /// The sender recorded in every message this wormhole passes.
    public let sender: String
    /// The directory the engine keeps the wormhole's files in (``WormholeEngine/storageDirectory``): a
    /// ``DirectoryEngine``'s; nil for engines that keep no directory.
    public var directory: String? { engine.storageDirectory }
    let logger: Logger
    let registry: ListenerRegistry
    /// Whether a pass posts the mailbox's notification name; not when the mailbox file's own write wakes listeners
    /// (``MailboxFileNotifier``).
    let postsPasses: Bool
    /// The engine's live transport, made with the wormhole (an engine makes it cheaply and connects on first use),
    /// so that a live message takes no lock to find it.
    let live: Result<any LiveTransport, WormholeError>

    /// Creates a wormhole in an application group's shared directory, as MMWormhole does.
    ///
    /// On Linux the group is a directory under ``GroupContainer/rootDirectory(environment:)``; it and the
    /// optional directory are created on demand, with mode 0700.
    ///
    /// - Parameters:
    ///   - applicationGroupIdentifier: The group, for example `group.com.example.app`.
    ///   - optionalDirectory: A subdirectory of the group's container for the wormhole's files; recommended, so
    ///     that the wormhole keeps to a directory of its own.
    ///   - configuration: File modes, coordination, notification strategy, coder, sender and logger.
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` for a bad group or directory name,
    ///   ``WormholeError/Code/directoryUnavailable`` when the directory cannot be created or written (on Apple
    ///   platforms also when the App Group is not configured), ``WormholeError/Code/untrustedFile`` when it is a
    ///   link or another user's.
    public convenience init(
        applicationGroupIdentifier: String,
        optionalDirectory: String? = nil,
        configuration: Configuration = Configuration()
    ) throws(WormholeError) {
        let directory = try GroupContainer.directory(
            forApplicationGroupIdentifier: applicationGroupIdentifier,
            optionalDirectory: optionalDirectory
        )
        try self.init(directory: directory, configuration: configuration)
    }

    /// Creates a wormhole on an explicit directory, created on demand with mode 0700.
    ///
    /// - Throws: as ``init(applicationGroupIdentifier:optionalDirectory:configuration:)``.
    public convenience init(directory: String, configuration: Configuration = Configuration()) throws(WormholeError) {
        let engine = try DirectoryEngine(
            directory: directory,
            coordination: configuration.coordination,
            notification: configuration.notification,
            options: configuration.fileOptions,
            logger: configuration.logger
        )
        self.init(
            engine: engine,
            coder: configuration.coder,
            sender: configuration.sender,
            logger: configuration.logger
        )
    }

    /// Creates a wormhole on an engine: a ``DirectoryEngine``, `WormholeTesting`'s `InMemoryEngine`, or an engine
    /// that carries the wormhole across hosts.
    ///
    /// ```swift
    /// let wormhole = Wormhole(engine: try DirectoryEngine(directory: "/tmp/example-wormhole"))
    /// ```
    ///
    /// - Parameters:
    ///   - engine: What stores and wakes every mode.
    ///   - coder: How messages are encoded; JSON by default.
    ///   - sender: The sender recorded with each message.
    ///   - logger: Where errors that have no handler go.
    public init(
        engine: any WormholeEngine,
        coder: any MessageCoder = JSONMessageCoder(),
        sender: String = Configuration.defaultSender,
        logger: Logger = Logger(label: "wormhole")
    ) {
        self.engine = engine
        // Kept here, not asked of the engine on every pass: the mailbox's path makes no existential call for them.
        self.transiting = engine.transiting
        self.notifier = engine.notifier
        self.postsPasses = !engine.mailboxWritesWakeListeners
        self.coder = coder
        self.sender = sender
        self.logger = logger
        self.registry = ListenerRegistry()
        do throws(WormholeError) {
            self.live = .success(try engine.liveTransport(sender: sender))
        } catch {
            self.live = .failure(error)
        }
    }

    /// Creates a wormhole from parts: a transiting, a notifier and a coder of your own, or the test doubles of
    /// `WormholeTesting`, in MMWormhole's style.
    ///
    /// When the transiting is a ``FileTransiting`` or a ``CoordinatedFileTransiting``, every mode works, in its
    /// directory. With another transiting only mailboxes do: queues, suites, live messages and transfers throw
    /// ``WormholeError/Code/unsupported``; give ``init(engine:coder:sender:logger:)`` an engine instead.
    public convenience init(
        transiting: any Transiting,
        notifier: any Notifier,
        coder: any MessageCoder = JSONMessageCoder(),
        sender: String = Configuration.defaultSender,
        logger: Logger = Logger(label: "wormhole")
    ) {
        let engine: any WormholeEngine =
            DirectoryEngine.fromParts(transiting: transiting, notifier: notifier, logger: logger)
            ?? MailboxOnlyEngine(transiting: transiting, notifier: notifier)
        self.init(engine: engine, coder: coder, sender: sender, logger: logger)
    }
}
