import Foundation

/// The storage and wake-up behind every delivery mode of a wormhole: mailboxes, queues, suites, live messages and
/// file transfers.
///
/// A ``Wormhole`` encodes and decodes messages, validates identifiers, runs callbacks where the caller asked and
/// builds every `AsyncSequence`; an engine only stores bytes and wakes listeners. ``DirectoryEngine`` keeps
/// everything in a directory shared by the processes of one host; `WormholeTesting`'s `InMemoryEngine` keeps it in
/// the memory of one process, for tests; other engines carry the same calls across hosts.
///
/// ```swift
/// let engine = try DirectoryEngine(directory: "/tmp/example-wormhole")
/// let wormhole = Wormhole(engine: engine)
/// try wormhole.queue("jobs").enqueue("first job")
/// ```
///
/// Every engine is held to the same contract: the promise of each mode is stated on its protocol
/// (``Transiting``, ``Notifier``, ``QueueLog``, ``SuiteStore``, ``LiveTransport``, ``TransferStaging``), and the
/// package's contract test suites run every mode against every engine. An engine's calls may block for I/O, as file
/// calls do; they never wait for another process's work to finish.
///
/// An engine that does not offer a mode throws ``WormholeError/Code/unsupported`` from the method that makes it.
///
/// **Not yet stable.** `WormholeEngine` and the protocols of the modes beyond mailboxes (``QueueLog``,
/// ``QueueCursor``, ``SuiteStore``, ``LiveTransport``, ``TransferStaging``) may change in a minor release before
/// 1.0, as the modes grow (workers sharing a queue, say): an engine of your own follows them. ``Transiting``
/// and ``Notifier``, MMWormhole's two protocols, are kept.
public protocol WormholeEngine: Sendable {
    /// What the engine is, for messages and logs: `directory /path`, `in-memory`.
    var description: String { get }

    /// Where mailboxes keep their newest message.
    var transiting: any Transiting { get }

    /// How mailbox listeners are woken.
    var notifier: any Notifier { get }

    /// Whether a write of a mailbox through ``transiting`` wakes the listeners of ``notifier`` by itself, so that a
    /// pass posts no notification after it: false by default. ``DirectoryEngine`` says true where its notifier watches
    /// the mailbox files (Linux's inotify).
    ///
    /// Say true only when it holds for every write: with true and a notifier that writes do not wake, a pass wakes
    /// no listener at all.
    var mailboxWritesWakeListeners: Bool { get }

    /// The directory the engine keeps every mode in, when it keeps them in one: nil by default.
    var storageDirectory: String? { get }

    /// The log of the durable queue `identifier`, whose appends record `sender`.
    ///
    /// - Parameters:
    ///   - identifier: A valid identifier (the wormhole has checked it).
    ///   - sender: The sender recorded in each record appended through this log.
    ///   - retention: How long a consumer may stay away and still hold back reclaiming space.
    func queueLog(_ identifier: String, sender: String, retention: Duration) throws(WormholeError) -> any QueueLog

    /// The store of the key-value suite `name`.
    func suiteStore(_ name: String) throws(WormholeError) -> any SuiteStore

    /// The transport of live messages and requests, sending as `sender`.
    ///
    /// A wormhole asks for it once, when it is made: make it cheaply, and connect on first use.
    func liveTransport(sender: String) throws(WormholeError) -> any LiveTransport

    /// The staging area of the file-transfer channel `identifier`.
    func transferStaging(_ identifier: String) throws(WormholeError) -> any TransferStaging
}

extension WormholeEngine {
    /// False: a pass posts its notification.
    public var mailboxWritesWakeListeners: Bool { false }

    /// None.
    public var storageDirectory: String? { nil }

    /// The error an engine throws for a mode it does not offer.
    public func unsupported(_ mode: String, identifier: String? = nil) -> WormholeError {
        WormholeError(
            .unsupported,
            "This wormhole's engine (\(description)) has no \(mode). Make the wormhole with Wormhole(directory:), "
                + "Wormhole(applicationGroupIdentifier:optionalDirectory:) or Wormhole(engine:) with an engine that "
                + "offers every mode.",
            identifier: identifier
        )
    }
}
