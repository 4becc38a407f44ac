import Foundation
import Synchronization

extension Wormhole {
    // MARK: Live messages

    /// Sends a message to every process listening for `identifier` right now; nothing is stored.
    ///
    /// This is WatchConnectivity's `sendMessage` between processes: a message for whoever is there. When nobody is
    /// listening, it fails at once with ``WormholeError/Code/notReachable``; for a message that must wait for its
    /// reader, pass it to a mailbox or a queue instead.
    ///
    /// On a directory, a message is one datagram to each listener's socket, over a socket kept connected to it for
    /// the next message; on Linux (ext4 and tmpfs), whether listeners came or went is read from memory shared with
    /// them, so a message costs one `send` per listener and no other system call (elsewhere, an `fstat` of the
    /// directory too). A listener that falls behind holds its messages in its socket's queue; when that is full
    /// (about 10 messages by default on Linux, `net.unix.max_dgram_qlen`), sending to it waits until it reads again or
    /// ends (a process stopped in a debugger holds the sends to it that long), after every other listener has the
    /// message. Requests are bounded by their time-out.
    ///
    /// - Returns: How many processes it reached.
    /// - Throws: ``WormholeError/Code/notReachable``, ``WormholeError/Code/messageTooLarge`` (over 64 KiB),
    ///   ``WormholeError/Code/encodingFailed``, ``WormholeError/Code/invalidIdentifier``.
    @discardableResult
    public func sendMessage<Message: Encodable>(_ message: Message, identifier: String) throws(WormholeError) -> Int {
        try sendMessageData(try coder.encodeMessage(message, identifier: identifier), identifier: identifier)
    }

    /// Sends bytes as they are to every process listening for `identifier` right now.
    @discardableResult
    public func sendMessageData(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        try MessageIdentifier.validate(identifier)
        try checkLiveSize(payload, identifier: identifier)
        return try liveTransport().send(payload, identifier: identifier)
    }

    /// Calls `listener` with each live message sent to `identifier` while this listener lives.
    ///
    /// - Parameters:
    ///   - identifier: The name to listen on (rules of ``MessageIdentifier``).
    ///   - type: The type of the messages.
    ///   - execution: Where `listener` runs; by default ``CallbackExecution/automatic``, which, on the directory
    ///     engine, runs it on the thread that reads the listener's socket, with no hand-off (one that blocks moves to a
    ///     serial queue of the listener's own, while another thread goes on reading), on PostgreSQL on the thread
    ///     that takes the listener's notifications, and in memory on that queue.
    ///   - errorHandler: Called with a message that cannot be decoded as `type`, or that was lost on the way to
    ///     the listener (as ``listenForLiveMessageData(withIdentifier:on:errorHandler:listener:)`` says); listening
    ///     goes on. When nil, the error is logged.
    ///   - listener: Called with each message.
    /// - Returns: The listener; it stops when cancelled or released.
    /// - Throws: ``WormholeError`` when the endpoint cannot be created.
    public func listenForLiveMessages<Message: Decodable & Sendable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Message) -> Void
    ) throws(WormholeError) -> LiveListener {
        try listenForLiveMessageData(withIdentifier: identifier, on: execution, errorHandler: errorHandler) {
            [self] payload in
            do throws(WormholeError) {
                listener(try decodeLive(type, payload, identifier: identifier))
            } catch {
                report(error, to: errorHandler)
            }
        }
    }

    /// Calls `listener` with the bytes of each live message sent to `identifier` while this listener lives, as
    /// ``sendMessageData(_:identifier:)`` sent them.
    ///
    /// - Parameters:
    ///   - identifier: The name to listen on (rules of ``MessageIdentifier``).
    ///   - execution: Where `listener` runs; by default ``CallbackExecution/automatic``, which, on the directory
    ///     engine, runs it on the thread that reads the listener's socket, with no hand-off (one that blocks moves to a
    ///     serial queue of the listener's own, while another thread goes on reading), on PostgreSQL on the thread
    ///     that takes the listener's notifications, and in memory on that queue.
    ///   - errorHandler: Called, where `listener` runs and in turn with it, with a message that reached the listener
    ///     but was lost on the way to it (on PostgreSQL, a large message's body that was gone when it came,
    ///     ``WormholeError/Code/notReachable``; one that was not Base64, ``WormholeError/Code/corruptMessage``; or
    ///     the server's error reading it); listening goes on. When nil, the error is logged. (Once the endpoint
    ///     listens it goes on: out of descriptors or memory, it pauses and tries again.)
    ///   - listener: Called with the bytes of each message.
    /// - Returns: The listener; it stops when cancelled or released.
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError`` when the endpoint cannot be
    ///   created.
    public func listenForLiveMessageData(
        withIdentifier identifier: String,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Data) -> Void
    ) throws(WormholeError) -> LiveListener {
        try MessageIdentifier.validate(identifier)
        let schedule = execution.makeScheduler(label: "wormhole.live.\(identifier)")
        let handle = LiveListener(identifier: identifier)
        let cancelled = handle.cancelled
        let observation = try liveTransport().listen(
            identifier: identifier,
            handler: { message in
                schedule {
                    guard !cancelled.isSet else { return }
                    listener(message.payload)
                }
            },
            lost: { [self] error in
                // Where the listener runs, in turn with its messages.
                schedule {
                    guard !cancelled.isSet else { return }
                    self.report(error, to: errorHandler)
                }
            }
        )
        handle.attach(observation)
        return handle
    }

    /// The live messages sent to `identifier`, as an `AsyncSequence`, from the call on.
    ///
    /// A message that cannot be decoded as `type` ends the sequence with ``WormholeError/Code/decodingFailed``. A
    /// message lost on its way (on PostgreSQL, a large message's body gone when it came) is logged, and the sequence
    /// goes on.
    @inlinable  // specialised where the loop is written: the hand-over runs per message (ListeningChannel)
    public func liveMessages<Message: Decodable & Sendable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self
    ) -> ListeningSequence<Message> {
        ListeningSequence { (continuation) throws(WormholeError) in
            try listenForLiveMessageData(withIdentifier: identifier, on: .notifierThread) { [self] payload in
                do throws(WormholeError) {
                    continuation.yield(try decodeLive(type, payload, identifier: identifier))
                } catch {
                    continuation.finish(throwing: error)
                }
            }
        }
    }

    // MARK: Requests and replies

    /// Sends a request to one process answering `identifier` and waits for its reply.
    ///
    /// ```swift
    /// let answer = try await wormhole.request(Query(term: "swift"), identifier: "lookup", as: Answer.self,
    ///                                         timeout: .seconds(1))
    /// ```
    ///
    /// The waiting happens on a thread of its own, never on the cooperative thread pool.
    ///
    /// - Throws: ``WormholeError/Code/notReachable`` when no process answers `identifier`,
    ///   ``WormholeError/Code/timedOut`` after `timeout`, ``WormholeError/Code/remoteFailure`` when the responder
    ///   threw (its error's description is in the message) or its process ended before replying (at once, not at the
    ///   time-out), ``WormholeError/Code/decodingFailed`` for a reply of another type.
    public func request<Query: Encodable, Answer: Decodable & Sendable>(
        _ query: Query,
        identifier: String,
        as type: Answer.Type = Answer.self,
        timeout: Duration = .seconds(5)
    ) async throws(WormholeError) -> Answer {
        let payload = try coder.encodeMessage(query, identifier: identifier)
        let reply = try await requestData(payload, identifier: identifier, timeout: timeout)
        return try decodeLive(type, reply, identifier: identifier)
    }

    /// Sends bytes as a request and returns the reply's bytes; see ``request(_:identifier:as:timeout:)``.
    public func requestData(
        _ payload: Data,
        identifier: String,
        timeout: Duration = .seconds(5)
    ) async throws(WormholeError) -> Data {
        try MessageIdentifier.validate(identifier)
        try checkLiveSize(payload, identifier: identifier)
        let transport = try liveTransport()
        // A thread of its own: the wait must block neither the cooperative pool nor Dispatch's shared threads,
        // which grow slowly when many requests wait at once.
        let result: Result<Data, WormholeError> = await withCheckedContinuation { continuation in
            Thread {
                continuation.resume(returning: transport.request(payload, identifier: identifier, timeout: timeout))
            }.start()
        }
        return try result.get()
    }

    /// Answers each request sent to `identifier` with what `responder` returns; an error it throws goes back to the
    /// requester as ``WormholeError/Code/remoteFailure``.
    ///
    /// Any number of processes may answer one identifier; each request goes to one of them.
    ///
    /// - Parameters:
    ///   - identifier: The name to answer on (rules of ``MessageIdentifier``).
    ///   - type: The type of the requests.
    ///   - execution: Where `responder` runs; by default ``CallbackExecution/automatic``, which, on the directory
    ///     engine, runs it on the thread that reads the responder's socket (one that blocks moves to a serial queue of
    ///     the responder's own), on PostgreSQL on the thread that takes its notifications, and in memory on that
    ///     queue.
    ///   - errorHandler: Called when a request cannot be decoded as `type`, or `responder` throws (the requester
    ///     gets the error too); when nil, the error is logged.
    ///   - responder: Called with each request; what it returns is encoded and sent back as the reply.
    /// - Returns: The responder; it stops answering when cancelled or released.
    public func respondToRequests<Query: Decodable & Sendable, Answer: Encodable & Sendable>(
        withIdentifier identifier: String,
        as type: Query.Type = Query.self,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        responder: @escaping @Sendable (Query) throws -> Answer
    ) throws(WormholeError) -> LiveListener {
        try respondToRequestData(withIdentifier: identifier, on: execution, errorHandler: errorHandler) {
            [self] payload in
            let query = try decodeLive(type, payload, identifier: identifier)
            return try coder.encode(try responder(query))
        }
    }

    /// The requests sent to `identifier`, as an `AsyncSequence`: answer each with ``LiveRequest/reply(_:)`` or
    /// ``LiveRequest/fail(_:)``.
    ///
    /// ```swift
    /// for try await request in wormhole.incomingRequests(withIdentifier: "echo") {
    ///     request.reply(request.payload)
    /// }
    /// ```
    ///
    /// The endpoint answers requests from the call on. A request dropped without an answer fails, so that its
    /// requester is never left waiting for its time-out; a request the iteration has not reached when the sequence
    /// ends fails the same way.
    public func incomingRequests(withIdentifier identifier: String) -> ListeningSequence<LiveRequest> {
        ListeningSequence { (continuation) throws(WormholeError) in
            try MessageIdentifier.validate(identifier)
            let handle = LiveListener(identifier: identifier)
            handle.attach(
                try liveTransport().respond(identifier: identifier) { request in continuation.yield(request) }
            )
            return handle
        }
    }

    /// Answers each request sent to `identifier` with bytes; see
    /// ``respondToRequests(withIdentifier:as:on:errorHandler:responder:)``.
    public func respondToRequestData(
        withIdentifier identifier: String,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        responder: @escaping @Sendable (Data) throws -> Data
    ) throws(WormholeError) -> LiveListener {
        try MessageIdentifier.validate(identifier)
        let schedule = execution.makeScheduler(label: "wormhole.respond.\(identifier)")
        let handle = LiveListener(identifier: identifier)
        let cancelled = handle.cancelled
        let observation = try liveTransport().respond(identifier: identifier) { [self] request in
            schedule { [self] in
                guard !cancelled.isSet else {
                    request.fail("the responder stopped before answering")
                    return
                }
                do {
                    request.reply(try responder(request.payload))
                } catch {
                    request.fail("\(error)")
                    let reported: WormholeError =
                        (error as? WormholeError)
                        ?? .handlerFailed(
                            error,
                            "answering a request from \(request.sender); the requester was told",
                            identifier: identifier
                        )
                    report(reported, to: errorHandler)
                }
            }
        }
        handle.attach(observation)
        return handle
    }

    // MARK: Plumbing

    /// The engine's live transport, made with the wormhole: it holds the connections messages go out on.
    func liveTransport() throws(WormholeError) -> any LiveTransport {
        try live.get()
    }

    private func checkLiveSize(_ payload: Data, identifier: String) throws(WormholeError) {
        guard payload.count <= Self.maximumLiveMessageSize - 256 - sender.utf8.count else {
            throw WormholeError(
                .messageTooLarge,
                "Live messages and requests carry up to 64 KiB; this one is \(payload.count) bytes. Use a queue or a "
                    + "file transfer for more.",
                identifier: identifier
            )
        }
    }

    /// The largest live message or request, with its sender and framing, whatever the engine.
    static let maximumLiveMessageSize = 64 * 1024

    @usableFromInline
    func decodeLive<Message: Decodable>(
        _ type: Message.Type,
        _ payload: Data,
        identifier: String
    ) throws(WormholeError) -> Message {
        do {
            return try coder.decode(type, from: payload)
        } catch {
            throw WormholeError(
                .decodingFailed,
                "The live message is not a \(Message.self): \(error).",
                identifier: identifier,
                underlyingError: error
            )
        }
    }
}
