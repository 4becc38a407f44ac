import Foundation

extension WormholeSession {
    // MARK: Messages

    /// Sends a message to the counterpart and waits for its reply (`sendMessage(_:replyHandler:errorHandler:)`).
    ///
    /// A message is live: it goes only to an activated counterpart, now. The waiting happens on a thread of its own,
    /// never on Swift's cooperative pool.
    ///
    /// - Parameters:
    ///   - message: The message.
    ///   - expectsReply: Whether the counterpart's handlers are to reply; when false, the call returns an empty
    ///     dictionary once they have all returned.
    ///   - timeout: How long to wait for the reply.
    /// - Returns: The reply.
    /// - Throws: ``WormholeError/Code/notActivated`` (this side), ``WormholeError/Code/notReachable`` (the
    ///   counterpart is not activated now), ``WormholeError/Code/counterpartUnknown`` (it never activated),
    ///   ``WormholeError/Code/timedOut``, ``WormholeError/Code/remoteFailure`` (its handler failed, it has no message
    ///   handler, or it ended before replying), ``WormholeError/Code/messageTooLarge`` (over 60 KiB encoded).
    @discardableResult
    public func sendMessage(
        _ message: [String: JSONValue],
        expectsReply: Bool = true,
        timeout: Duration = .seconds(10)
    ) async throws(WormholeError) -> [String: JSONValue] {
        let result: Result<[String: JSONValue], WormholeError> = await withCheckedContinuation { continuation in
            Thread { [self] in
                continuation.resume(
                    returning: Result(catching: { () throws(WormholeError) in
                        try sendMessageWaiting(message, expectsReply: expectsReply, timeout: timeout)
                    })
                )
            }.start()
        }
        return try result.get()
    }

    /// Sends a message and calls exactly one of `replyHandler` or `errorHandler`, as WatchConnectivity's form does.
    ///
    /// With no `replyHandler`, the counterpart does not reply, and `errorHandler` is called only on failure. With
    /// no `errorHandler` either, a failure is logged (or goes to ``onError(on:handler:)``'s handlers): it is never
    /// dropped. The handlers run where `execution` says; the waiting happens on a thread of its own.
    public func sendMessage(
        _ message: [String: JSONValue],
        replyHandler: (@Sendable ([String: JSONValue]) -> Void)?,
        errorHandler: (@Sendable (WormholeError) -> Void)?,
        timeout: Duration = .seconds(10),
        on execution: CallbackExecution = .automatic
    ) {
        let schedule = execution.makeScheduler(label: "wormhole.session.\(name).reply")
        Thread { [self] in
            do throws(WormholeError) {
                let reply = try sendMessageWaiting(message, expectsReply: replyHandler != nil, timeout: timeout)
                if let replyHandler { schedule { replyHandler(reply) } }
            } catch {
                if let errorHandler { schedule { errorHandler(error) } } else { report(error) }
            }
        }.start()
    }

    /// Sends a message and blocks the calling thread until the reply; the two public forms run it on a thread of
    /// their own, and MMWormhole's message transiting on the caller's.
    func sendMessageWaiting(
        _ message: [String: JSONValue],
        expectsReply: Bool,
        timeout: Duration
    ) throws(WormholeError) -> [String: JSONValue] {
        try requireActivated("send a message")
        let payload = try Self.encode(SessionWireMessage(message: message, expectsReply: expectsReply))
        guard payload.count <= 60 * 1024 else {
            throw WormholeError(
                .messageTooLarge,
                "A session message carries up to 60 KiB; this one is \(payload.count) bytes. Use transferUserInfo "
                    + "or transferFile for more.",
                identifier: outgoing.message
            )
        }
        let transport = try wormhole.liveTransport()
        switch transport.request(payload, identifier: outgoing.message, timeout: timeout) {
        case .success(let reply):
            setReachable(true)
            return try Self.decode([String: JSONValue].self, from: reply, identifier: outgoing.message)
        case .failure(let error) where error.code == .notReachable:
            setReachable(false)
            if try !counterpartIsKnown() {
                throw WormholeError(
                    .counterpartUnknown,
                    "\(counterpart) has never activated a session with \(name), so a message has nobody to go to; "
                        + "an application context, user info or a file would wait for it.",
                    identifier: outgoing.message
                )
            }
            throw WormholeError(
                .notReachable,
                "\(counterpart) is not reachable: its session is not activated now. An application context, user "
                    + "info or a file would wait for it.",
                identifier: outgoing.message
            )
        case .failure(let error):
            throw error
        }
    }

    /// Answers the counterpart's messages while activated: each goes to every message handler.
    func respondToMessages() throws(WormholeError) -> any WormholeCancellable {
        let handle = LiveListener(identifier: incoming.message)
        let observation = try wormhole.liveTransport().respond(identifier: incoming.message) { [weak self] request in
            guard let self else { return request.fail("the session ended") }
            // Off the transport's thread: handlers may take their time, and replies may come later.
            receiving.async { self.receiveMessage(request) }
        }
        handle.attach(observation)
        return handle
    }

    private func receiveMessage(_ request: LiveRequest) {
        guard activationState == .activated else {
            request.fail("\(name) is not activated")
            return
        }
        let wire: SessionWireMessage
        do throws(WormholeError) {
            wire = try Self.decode(SessionWireMessage.self, from: request.payload, identifier: incoming.message)
        } catch {
            request.fail("\(error)")
            report(error)
            return
        }
        guard !messageHandlers.isEmpty else {
            request.fail("\(name) has no message handler")
            return
        }
        let message = SessionMessage(
            message: wire.message,
            sender: request.sender,
            expectsReply: wire.expectsReply,
            request: request
        )
        if wire.expectsReply {
            // Whoever keeps the message may reply later; once every reference is gone, an unanswered one fails.
            messageHandlers.deliver(message)
        } else if messageHandlers.deliverAndWait(message) {
            message.reply([:])
        } else {
            message.fail("\(name) has no message handler")
        }
    }

    /// Calls `handler` with each message the counterpart sends while this side is activated.
    ///
    /// When the counterpart waits for a reply, one handler answers with ``SessionMessage/reply(_:)``. With no
    /// handler, the counterpart's send fails with ``WormholeError/Code/remoteFailure``.
    public func onMessage(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (SessionMessage) -> Void
    ) -> SessionListener {
        messageHandlers.listen(on: execution, handler)
    }

    /// The messages received, as an `AsyncSequence`; see ``onMessage(on:handler:)``.
    public func messages() -> ListeningSequence<SessionMessage> {
        ListeningSequence { continuation in
            onMessage(on: .notifierThread) { continuation.yield($0) }
        }
    }

    // MARK: Observing the session

    /// Calls `handler` when the counterpart becomes reachable or stops being so (`sessionReachabilityDidChange`).
    public func onReachabilityChange(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (Bool) -> Void
    ) -> SessionListener {
        reachabilityHandlers.listen(on: execution, handler)
    }

    /// The changes of ``isReachable``, as an `AsyncSequence`.
    public func reachability() -> ListeningSequence<Bool> {
        ListeningSequence { continuation in
            onReachabilityChange(on: .notifierThread) { continuation.yield($0) }
        }
    }

    /// Calls `handler` with each change of ``activationState`` (`activationDidCompleteWith`,
    /// `sessionDidBecomeInactive`, `sessionDidDeactivate`).
    public func onActivationStateChange(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (SessionActivationState) -> Void
    ) -> SessionListener {
        activationHandlers.listen(on: execution, handler)
    }

    /// The changes of ``activationState``, as an `AsyncSequence`.
    public func activationStates() -> ListeningSequence<SessionActivationState> {
        ListeningSequence { continuation in
            onActivationStateChange(on: .notifierThread) { continuation.yield($0) }
        }
    }

    /// Calls `handler` with each error the session meets while receiving (a record it cannot read, the engine
    /// failing); with no handler, errors are logged. Errors of a call you make are thrown by that call.
    public func onError(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (WormholeError) -> Void
    ) -> SessionListener {
        errorHandlers.listen(on: execution, handler)
    }
}
