import Foundation

/// MMWormhole's mailboxes: the newest message of each identifier, passed, read and cleared. Listening is in
/// `Wormhole+MailboxListening.swift`.
extension Wormhole {
    /// The notification name of a mailbox: posted after each pass, but on a ``DirectoryEngine``, whose mailbox
    /// files wake their listeners themselves.
    static func notificationName(forIdentifier identifier: String) -> String { "mailbox." + identifier }

    // MARK: Passing

    /// Encodes a message and stores it as the newest message of a mailbox, then wakes its listeners.
    ///
    /// - Parameters:
    ///   - message: Any `Encodable` value.
    ///   - identifier: The mailbox (see ``MessageIdentifier`` for the rules).
    /// - Returns: The envelope as stored, with its sequence number.
    /// - Throws: ``WormholeError`` with ``WormholeError/Code/encodingFailed``,
    ///   ``WormholeError/Code/invalidIdentifier``, ``WormholeError/Code/diskFull`` and the other codes of
    ///   ``Transiting/writeMessage(_:sender:identifier:)``.
    @discardableResult
    public func passMessageObject<Message: Encodable>(
        _ message: Message,
        identifier: String
    ) throws(WormholeError) -> Envelope {
        try passMessageData(try coder.encodeMessage(message, identifier: identifier), identifier: identifier)
    }

    /// Stores bytes as they are as the newest message of a mailbox, then wakes its listeners.
    ///
    /// Use it to pass data encoded by other means; ``messageData(withIdentifier:)`` reads it back.
    @discardableResult
    public func passMessageData(_ payload: Data, identifier: String) throws(WormholeError) -> Envelope {
        let envelope = try transiting.writeMessage(payload, sender: sender, identifier: identifier)
        // On a directory, the mailbox file's write has woken its listeners already.
        if postsPasses { try notifier.post(Self.notificationName(forIdentifier: identifier)) }
        return envelope
    }

    // MARK: Reading

    /// The newest message of a mailbox, decoded as `type`, or nil when the mailbox is empty.
    ///
    /// - Throws: ``WormholeError/Code/decodingFailed`` when the message is not a `type`, and the codes of
    ///   ``Transiting/readMessage(identifier:)`` for a damaged file.
    public func message<Message: Decodable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self
    ) throws(WormholeError) -> Message? {
        guard let envelope = try transiting.readMessage(identifier: identifier) else { return nil }
        return try decode(type, from: envelope, identifier: identifier)
    }

    /// The newest message of a mailbox as stored bytes, or nil when the mailbox is empty.
    public func messageData(withIdentifier identifier: String) throws(WormholeError) -> Data? {
        try transiting.readMessage(identifier: identifier)?.payload
    }

    /// The newest message of a mailbox with its sequence, sender and time, or nil when the mailbox is empty.
    public func envelope(withIdentifier identifier: String) throws(WormholeError) -> Envelope? {
        try transiting.readMessage(identifier: identifier)
    }

    /// The identifiers of the mailboxes that hold a message, sorted.
    public func identifiers() throws(WormholeError) -> [String] {
        try transiting.identifiers()
    }

    @usableFromInline
    func decode<Message: Decodable>(
        _ type: Message.Type,
        from envelope: Envelope,
        identifier: String
    ) throws(WormholeError) -> Message {
        do {
            return try coder.decode(type, from: envelope.payload)
        } catch {
            throw WormholeError(
                .decodingFailed,
                "The message in the mailbox is not a \(Message.self) (passed by \(envelope.sender), sequence "
                    + "\(envelope.sequence)): \(error). Check that both sides use the same message type.",
                identifier: identifier,
                underlyingError: error
            )
        }
    }

    // MARK: Clearing

    /// Empties one mailbox. Listeners are not called; the next message passed is delivered as usual.
    public func clearMessageContents(forIdentifier identifier: String) throws(WormholeError) {
        try transiting.deleteMessage(identifier: identifier)
    }

    /// Empties every mailbox of the wormhole.
    ///
    /// On a directory, a mailbox that cannot be emptied (a file of another format version, which is kept for the
    /// processes that read it) does not stop the others: each one that can be is emptied, then the first failure is
    /// thrown (saying how many of how many failed). What would fail every mailbox alike stops the clearing at once:
    /// ``WormholeError/Code/suspended``, ``WormholeError/Code/directoryUnavailable`` and
    /// ``WormholeError/Code/diskFull``.
    public func clearAllMessageContents() throws(WormholeError) {
        try transiting.deleteAllMessages()
    }
}
