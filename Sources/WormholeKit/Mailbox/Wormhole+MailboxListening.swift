import Foundation

extension Wormhole {
    /// Calls `listener` with each new message of a mailbox, passed from this process or another one.
    ///
    /// Any number of listeners may listen to one identifier, in any number of processes. A listener registered
    /// before a message is passed receives it; messages passed in quick succession may be coalesced to the newest,
    /// but a listener never receives an older message after a newer one, nor the same message twice.
    ///
    /// ```swift
    /// let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .main) { tap in
    ///     MainActor.assumeIsolated { label.text = "\(tap.number)" }   // .main runs it on the main actor
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - identifier: The mailbox.
    ///   - type: The type of its messages.
    ///   - deliveringCurrentMessage: Whether the message already in the mailbox, if any, is delivered first: the
    ///     way to catch up on what was passed while this process was away.
    ///   - execution: Where the callbacks run; by default ``CallbackExecution/automatic``: in order, on the
    ///     notifier's thread while they return quickly.
    ///   - errorHandler: Called when a message cannot be read or decoded; listening goes on. When nil, the error
    ///     is logged.
    ///   - listener: Called with each new message.
    /// - Returns: The listener; it stops when cancelled or released.
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError/Code/notifierUnavailable`` when
    ///   notifications cannot be observed.
    public func listenForMessage<Message: Decodable & Sendable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self,
        deliveringCurrentMessage: Bool = false,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Message) -> Void
    ) throws(WormholeError) -> MessageListener {
        try listenForEnvelopes(
            withIdentifier: identifier,
            deliveringCurrentMessage: deliveringCurrentMessage,
            on: execution,
            errorHandler: errorHandler
        ) { [self] envelope in
            do throws(WormholeError) {
                listener(try decode(type, from: envelope, identifier: identifier))
            } catch {
                report(error, to: errorHandler)
            }
        }
    }

    /// Calls `listener` with each new message of a mailbox as stored: bytes, sequence, sender and time.
    ///
    /// The same guarantees as ``listenForMessage(withIdentifier:as:deliveringCurrentMessage:on:errorHandler:listener:)``.
    public func listenForEnvelopes(
        withIdentifier identifier: String,
        deliveringCurrentMessage: Bool = false,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Envelope) -> Void
    ) throws(WormholeError) -> MessageListener {
        try MessageIdentifier.validate(identifier)
        let id = registry.makeID()
        let handle: @Sendable (Result<Envelope, WormholeError>) -> Void = { [self] result in
            switch result {
            case .success(let envelope): listener(envelope)
            case .failure(let error): report(error, to: errorHandler)
            }
        }
        let sink: ListenerSink
        if execution.runsOnNotifierThread {
            // No hop, so no work item to make: the fastest path pays for no closure per message.
            sink = ListenerSink(id: id, deliver: handle)
        } else {
            let schedule = execution.makeScheduler(label: "wormhole.listener.\(identifier).\(id)")
            // A listener cancelled after its callback was scheduled (by another callback, say) skips it.
            let cancelled = Flag()
            sink = ListenerSink(id: id, cancelled: cancelled) { result in
                schedule { if !cancelled.isSet { handle(result) } }
            }
        }
        return try register(sink, identifier: identifier, deliveringCurrentMessage: deliveringCurrentMessage)
    }

    /// Listens to a mailbox as an `AsyncSequence` of its new messages.
    ///
    /// The listener is registered when this method returns, before iteration begins, so nothing passed after
    /// the call is missed. If the consumer falls behind, the sequence keeps the newest message and drops older
    /// unread ones: a mailbox holds one message. A message that cannot be read or decoded ends the sequence
    /// with a ``WormholeError`` (use the callback form to keep listening past bad messages); a bad identifier
    /// ends it at once.
    ///
    /// ```swift
    /// for try await tap in wormhole.messages(withIdentifier: "button", as: Tap.self) {
    ///     print("tapped", tap.number)
    /// }
    /// ```
    @inlinable  // specialised where the loop is written: the hand-over runs per message (ListeningChannel)
    public func messages<Message: Decodable & Sendable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self,
        deliveringCurrentMessage: Bool = false
    ) -> MessageSequence<Message> {
        ListeningSequence(bufferingPolicy: .bufferingNewest(1)) { (continuation) throws(WormholeError) in
            let listener = try listenForEnvelopes(
                withIdentifier: identifier,
                deliveringCurrentMessage: deliveringCurrentMessage,
                on: .notifierThread,
                errorHandler: { continuation.finish(throwing: $0) }
            ) { [self] envelope in
                do throws(WormholeError) {
                    continuation.yield(try decode(type, from: envelope, identifier: identifier))
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            // Stopped by stopListeningForMessage(withIdentifier:) too: the loop ends instead of waiting forever.
            listener.whenCancelled { continuation.finish() }
            return listener
        }
    }

    /// Reposts each new message of a mailbox to a `NotificationCenter`, as apps repost Darwin notifications as local
    /// ones, so that code written for `NotificationCenter` hears other processes' messages.
    ///
    /// ```swift
    /// let reposting = try wormhole.repostMessages(withIdentifier: "button", to: .default)
    /// let token = NotificationCenter.default.addObserver(
    ///     forName: Notification.Name("button"), object: nil, queue: nil
    /// ) { notification in
    ///     print("button message", notification.object ?? "")   // the message as a Foundation JSON object
    /// }
    /// ```
    ///
    /// Each notification's `object` is the message as a Foundation JSON object (`[String: Any]`, `[Any]`, a
    /// string, a number…; nil when the message is not JSON), and its `userInfo` holds the ``Envelope`` under
    /// `"envelope"` and the identifier under `"identifier"`. The guarantees are those of
    /// ``listenForEnvelopes(withIdentifier:deliveringCurrentMessage:on:errorHandler:listener:)``.
    ///
    /// - Parameters:
    ///   - identifier: The mailbox.
    ///   - center: Where to post.
    ///   - name: The notification's name; the identifier by default.
    ///   - deliveringCurrentMessage: Whether the message already in the mailbox, if any, is posted first.
    ///   - execution: Where the posts are made (observers run there, as `NotificationCenter` calls them on the
    ///     posting thread unless they asked for a queue); by default ``CallbackExecution/automatic``, so observers
    ///     that gave no queue run on the notifier's thread while they return quickly.
    ///   - errorHandler: Called when a message cannot be read; when nil, the error is logged.
    /// - Returns: The listener; reposting stops when it is cancelled or released.
    public func repostMessages(
        withIdentifier identifier: String,
        to center: NotificationCenter,
        as name: Notification.Name? = nil,
        deliveringCurrentMessage: Bool = false,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil
    ) throws(WormholeError) -> MessageListener {
        let box = UncheckedSendableBox(center)
        let name = name ?? Notification.Name(identifier)
        return try listenForEnvelopes(
            withIdentifier: identifier,
            deliveringCurrentMessage: deliveringCurrentMessage,
            on: execution,
            errorHandler: errorHandler
        ) { envelope in
            let object = try? JSONSerialization.jsonObject(with: envelope.payload, options: [.fragmentsAllowed])
            box.value.post(
                name: name,
                object: object,
                userInfo: ["envelope": envelope, "identifier": identifier]
            )
        }
    }

    /// Stops every listener of this wormhole that listens to `identifier`.
    ///
    /// Listeners of other wormhole instances, in this process or others, go on.
    public func stopListeningForMessage(withIdentifier identifier: String) {
        registry.removeAll(identifier: identifier)
    }

    private func register(
        _ sink: ListenerSink,
        identifier: String,
        deliveringCurrentMessage: Bool
    ) throws(WormholeError) -> MessageListener {
        // Observe first, then read what is there: a message passed after this call is seen by one or the other.
        try registry.add(sink, identifier: identifier, transiting: transiting, notifier: notifier)
        let handle = MessageListener(identifier: identifier, sink: sink) { [weak registry] in
            registry?.remove(sink, identifier: identifier)
        }
        // A damaged mailbox now does not stop listening (the next good message is delivered); it is reported only to
        // a listener that asked for the current message.
        let current = Result { () throws(WormholeError) in try transiting.readMessage(identifier: identifier) }
        sink.settle(current: current, deliveringCurrent: deliveringCurrentMessage)
        return handle
    }

    func report(_ error: WormholeError, to handler: (@Sendable (WormholeError) -> Void)?) {
        ErrorReporting.report(error, to: handler, logger: logger, context: "wormhole \(engine.description)")
    }
}

/// The new messages of a mailbox, as an `AsyncSequence`; see
/// ``Wormhole/messages(withIdentifier:as:deliveringCurrentMessage:)``.
public typealias MessageSequence<Message: Sendable> = ListeningSequence<Message>
