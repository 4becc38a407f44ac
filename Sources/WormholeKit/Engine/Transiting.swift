import Foundation

/// Where a wormhole keeps its messages: one mailbox per identifier, each holding the newest message.
///
/// This is MMWormhole's `MMWormholeTransiting` with Swift types. The wormhole encodes and decodes messages and
/// posts notifications; a transiting only stores bytes. ``FileTransiting`` is the default;
/// ``CoordinatedFileTransiting`` adds cross-process locks; `WormholeTesting` ships an in-memory one.
///
/// Every implementation must pass this test (shown with `InMemoryTransiting`):
///
/// ```swift
/// let transiting = InMemoryTransiting()
/// let first = try transiting.writeMessage(Data("1".utf8), sender: "a", identifier: "x")
/// let second = try transiting.writeMessage(Data("2".utf8), sender: "a", identifier: "x")
/// #expect(second.sequence > first.sequence)
/// #expect(try transiting.readMessage(identifier: "x")?.payload == Data("2".utf8))
/// #expect(try transiting.identifiers() == ["x"])
/// try transiting.deleteMessage(identifier: "x")
/// #expect(try transiting.readMessage(identifier: "x") == nil)
/// ```
///
/// A conforming type must be safe to call from many threads and many processes at once: a reader sees either the
/// previous message or the new one, whole, never a mix; sequences of one mailbox only grow, even across
/// deletions, or the mailbox gets a new ``Envelope/generation``.
public protocol Transiting: Sendable {
    /// Stores `payload` as the newest message of a mailbox and returns the envelope as stored.
    ///
    /// - Throws: ``WormholeError`` with ``WormholeError/Code/invalidIdentifier``,
    ///   ``WormholeError/Code/messageTooLarge``, ``WormholeError/Code/diskFull`` (the previous message is kept)
    ///   or another file-system code.
    func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope

    /// The newest message of a mailbox, or `nil` when the mailbox is empty or was never written.
    ///
    /// - Throws: ``WormholeError`` with ``WormholeError/Code/corruptMessage``,
    ///   ``WormholeError/Code/truncatedMessage``, ``WormholeError/Code/unsupportedFormatVersion`` or
    ///   ``WormholeError/Code/untrustedFile`` for a bad file.
    func readMessage(identifier: String) throws(WormholeError) -> Envelope?

    /// Empties one mailbox. Emptying an empty mailbox does nothing.
    func deleteMessage(identifier: String) throws(WormholeError)

    /// Empties every mailbox.
    func deleteAllMessages() throws(WormholeError)

    /// The identifiers of the mailboxes that hold a message, sorted.
    func identifiers() throws(WormholeError) -> [String]

    /// The newest message of a mailbox, read for its listeners right after the notifier's observation of it was
    /// called: ``readMessage(identifier:)`` by default. A transiting that knows from its own notifier which checks
    /// such a read may skip does less (``FileTransiting``: one `pread` while the inotify monitor runs the handler).
    func readMessageOnWake(identifier: String) throws(WormholeError) -> Envelope?
}

extension Transiting {
    /// Reads as ``readMessage(identifier:)`` does.
    public func readMessageOnWake(identifier: String) throws(WormholeError) -> Envelope? {
        try readMessage(identifier: identifier)
    }
}
