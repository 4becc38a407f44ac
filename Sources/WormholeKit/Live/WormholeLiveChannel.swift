import Foundation

/// The live messages and requests of one identifier, as ``Wormhole/queue(_:retention:)``, ``Wormhole/suite(_:)`` and
/// ``Wormhole/transfers(_:)`` give the other modes: the same calls as the wormhole's, with the identifier said once.
///
/// ```swift
/// let cursor = try wormhole.live("cursor")
/// let listener = try cursor.listen(as: Int.self) { position in print("at", position) }
/// try cursor.send(42)                                   // to every process listening now; nothing is kept
///
/// let lookup = try wormhole.live("lookup")
/// let responder = try lookup.respond(as: String.self) { term in term.count }
/// let length = try await lookup.request("swift", as: Int.self)
/// ```
///
/// Each call is the wormhole's call of the same name (``Wormhole/sendMessage(_:identifier:)``,
/// ``Wormhole/listenForLiveMessages(withIdentifier:as:on:errorHandler:listener:)``, ``Wormhole/request(_:identifier:as:timeout:)``,
/// ``Wormhole/respondToRequests(withIdentifier:as:on:errorHandler:responder:)``…): it promises and throws what that
/// one does.
public struct WormholeLiveChannel: Sendable {
    /// The wormhole whose live transport the channel uses.
    public let wormhole: Wormhole
    /// The identifier of the channel's messages and requests.
    public let identifier: String

    init(wormhole: Wormhole, identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.wormhole = wormhole
        self.identifier = identifier
    }

    // MARK: Messages

    /// Sends `message` to every process listening now; returns how many listeners it reached
    /// (``Wormhole/sendMessage(_:identifier:)``).
    @discardableResult
    public func send<Message: Encodable>(_ message: Message) throws(WormholeError) -> Int {
        try wormhole.sendMessage(message, identifier: identifier)
    }

    /// Sends bytes as they are (``Wormhole/sendMessageData(_:identifier:)``).
    @discardableResult
    public func sendData(_ payload: Data) throws(WormholeError) -> Int {
        try wormhole.sendMessageData(payload, identifier: identifier)
    }

    /// Calls `listener` with each message sent from now on
    /// (``Wormhole/listenForLiveMessages(withIdentifier:as:on:errorHandler:listener:)``).
    public func listen<Message: Decodable & Sendable>(
        as type: Message.Type = Message.self,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Message) -> Void
    ) throws(WormholeError) -> LiveListener {
        try wormhole.listenForLiveMessages(
            withIdentifier: identifier,
            as: type,
            on: execution,
            errorHandler: errorHandler,
            listener: listener
        )
    }

    /// Calls `listener` with the bytes of each message sent from now on
    /// (``Wormhole/listenForLiveMessageData(withIdentifier:on:errorHandler:listener:)``).
    public func listenData(
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Data) -> Void
    ) throws(WormholeError) -> LiveListener {
        try wormhole.listenForLiveMessageData(
            withIdentifier: identifier,
            on: execution,
            errorHandler: errorHandler,
            listener: listener
        )
    }

    /// The messages sent from now on, as an `AsyncSequence` (``Wormhole/liveMessages(withIdentifier:as:)``).
    @inlinable  // as liveMessages(withIdentifier:as:) is, for the loop's module to specialise it
    public func messages<Message: Decodable & Sendable>(
        as type: Message.Type = Message.self
    ) -> ListeningSequence<Message> {
        wormhole.liveMessages(withIdentifier: identifier, as: type)
    }

    // MARK: Requests

    /// Sends `query` to one responder and returns its reply (``Wormhole/request(_:identifier:as:timeout:)``).
    public func request<Query: Encodable, Answer: Decodable & Sendable>(
        _ query: Query,
        as type: Answer.Type = Answer.self,
        timeout: Duration = .seconds(5)
    ) async throws(WormholeError) -> Answer {
        try await wormhole.request(query, identifier: identifier, as: type, timeout: timeout)
    }

    /// Sends bytes to one responder and returns its reply's bytes (``Wormhole/requestData(_:identifier:timeout:)``).
    public func requestData(_ payload: Data, timeout: Duration = .seconds(5)) async throws(WormholeError) -> Data {
        try await wormhole.requestData(payload, identifier: identifier, timeout: timeout)
    }

    /// Answers every request with what `responder` returns
    /// (``Wormhole/respondToRequests(withIdentifier:as:on:errorHandler:responder:)``).
    public func respond<Query: Decodable & Sendable, Answer: Encodable & Sendable>(
        as type: Query.Type = Query.self,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        responder: @escaping @Sendable (Query) throws -> Answer
    ) throws(WormholeError) -> LiveListener {
        try wormhole.respondToRequests(
            withIdentifier: identifier,
            as: type,
            on: execution,
            errorHandler: errorHandler,
            responder: responder
        )
    }

    /// Answers every request's bytes with the bytes `responder` returns
    /// (``Wormhole/respondToRequestData(withIdentifier:on:errorHandler:responder:)``).
    public func respondData(
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        responder: @escaping @Sendable (Data) throws -> Data
    ) throws(WormholeError) -> LiveListener {
        try wormhole.respondToRequestData(
            withIdentifier: identifier,
            on: execution,
            errorHandler: errorHandler,
            responder: responder
        )
    }

    /// The requests that come from now on, as an `AsyncSequence`, each answered with
    /// ``LiveRequest/reply(_:)`` (``Wormhole/incomingRequests(withIdentifier:)``).
    public func requests() -> ListeningSequence<LiveRequest> {
        wormhole.incomingRequests(withIdentifier: identifier)
    }
}

extension Wormhole {
    /// The live messages and requests of `identifier`, as one value whose calls need no identifier.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` when `identifier` breaks the rules of
    ///   ``MessageIdentifier``.
    public func live(_ identifier: String) throws(WormholeError) -> WormholeLiveChannel {
        try WormholeLiveChannel(wormhole: self, identifier: identifier)
    }
}
